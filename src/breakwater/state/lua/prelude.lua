-- Shared by every breaker script: Redis time, the state hash, replies and epochs.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(x) return string.format('%.0f', x) end
local function load(key, floor)
  local v = redis.call('HMGET', key, 'st', 'ep', 'ou', 'op', 'cf', 'le', 'rs')
  local s = {st = v[1] or 'closed', ep = tonumber(v[2] or '0'), ou = tonumber(v[3] or '0'), op = tonumber(v[4] or '0'),
             cf = tonumber(v[5] or '0'), le = tonumber(v[6] or '0'), rs = v[7] or '', fresh = not v[2],
             calls = '', failures = '', slow = ''}
  if s.fresh then s.ep = math.max(floor, 0) end
  return s
end
local function save(key, s, ttl)
  redis.call('HSET', key, 'st', s.st, 'ep', fmt(s.ep), 'ou', fmt(s.ou), 'op', s.op, 'cf', s.cf, 'le', fmt(s.le), 'rs', s.rs)
  redis.call('PEXPIRE', key, ttl)
end
local function reply(tag, s, now)
  return {tag, s.st, fmt(s.ep), fmt(s.ou), s.op, s.cf, fmt(s.le), s.rs, fmt(now), s.calls, s.failures, s.slow}
end
local function publish(channel, name, r)
  redis.call('PUBLISH', channel, cjson.encode({k = name, r = r}))
end
local function bump(s, floor, now)
  s.ep = math.max(s.ep, floor, now * 1000) + 1
end
