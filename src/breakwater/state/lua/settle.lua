-- SETTLE: one outcome with the epoch of its permit; a different epoch changes nothing.
-- KEYS[1] state; ARGV: name, epoch, outcome (s|f|i), slow (0|1), floor, ttl_ms, channel, window_ms,
-- minimum_calls, failure_rate, consecutive_failures, slow_call_rate, open_base_ms, open_max_ms, jitter factor
-- The window has 12 buckets, as the in-process breaker's (breakwater/gate/_breaker.py).
local floor = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local now = now_ms()
local s = load(KEYS[1], floor)
if tonumber(ARGV[2]) ~= s.ep then return reply('stale', s, now) end
local outcome = ARGV[3]
local slow = ARGV[4] == '1' and outcome ~= 'i'
local window = tonumber(ARGV[8])
local width = window / 12
local idx = math.floor(now / width)
local function open(reason)
  s.op = s.op + 1
  local base, cap = tonumber(ARGV[13]), tonumber(ARGV[14])
  local d = cap
  if s.op <= 64 then d = math.min(cap, base * 2 ^ (s.op - 1)) end
  d = math.min(cap, d * tonumber(ARGV[15]))
  bump(s, floor, now); s.st = 'open'; s.ou = now + d; s.le = 0; s.rs = reason
end
local function clear_window()
  for i = idx - 11, idx do redis.call('DEL', KEYS[1] .. ':w:' .. fmt(i)) end
end
if s.st == 'half_open' then
  if outcome == 'i' then
    s.le = 0
  elseif outcome == 's' and not slow then
    bump(s, floor, now); s.st = 'closed'; s.op = 0; s.cf = 0; s.ou = 0; s.le = 0; s.rs = ''; clear_window()
  elseif outcome == 's' then
    open('probe was slow')
  else
    open('probe failed')
  end
  save(KEYS[1], s, ttl)
  local r = reply('applied', s, now)
  publish(ARGV[7], ARGV[1], r)
  return r
end
if s.st ~= 'closed' or outcome == 'i' then return reply('ignored', s, now) end
local failed = outcome == 'f'
local bkey = KEYS[1] .. ':w:' .. fmt(idx)
redis.call('HINCRBY', bkey, 'calls', 1)
if failed then redis.call('HINCRBY', bkey, 'failures', 1) end
if slow then redis.call('HINCRBY', bkey, 'slow', 1) end
redis.call('PEXPIRE', bkey, math.ceil(window + width))
if failed then s.cf = s.cf + 1 else s.cf = 0 end
local calls, failures, slows = 0, 0, 0
for i = idx - 11, idx do
  local b = redis.call('HMGET', KEYS[1] .. ':w:' .. fmt(i), 'calls', 'failures', 'slow')
  calls = calls + tonumber(b[1] or '0'); failures = failures + tonumber(b[2] or '0'); slows = slows + tonumber(b[3] or '0')
end
s.calls, s.failures, s.slow = calls, failures, slows
local reason = nil
local secs = string.format('%g', window / 1000)
if s.cf >= tonumber(ARGV[11]) then
  reason = s.cf .. ' consecutive failures'
elseif calls >= tonumber(ARGV[9]) then
  if failures / calls >= tonumber(ARGV[10]) then
    reason = failures .. ' of ' .. calls .. ' calls failed in ' .. secs .. ' s'
  elseif slows / calls >= tonumber(ARGV[12]) then
    reason = slows .. ' of ' .. calls .. ' calls were slow in ' .. secs .. ' s'
  end
end
if reason then open(reason) end
save(KEYS[1], s, ttl)
local r = reply('applied', s, now)
if reason then publish(ARGV[7], ARGV[1], r) end
return r
