-- READ: the state of many breakers at once (refresh and resync).
-- KEYS: states; ARGV: channel, ttl_ms, then per key: name, floor
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local name, floor = ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i])
  local s = load(key, floor)
  if s.fresh then
    out[i] = reply('missing', s, now)
  else
    if floor > s.ep then
      -- Redis restarted and another replica re-created the key below what this one has seen.
      bump(s, floor, now); save(key, s, tonumber(ARGV[2]))
      out[i] = reply('state', s, now)
      publish(ARGV[1], name, out[i])
    else
      out[i] = reply('state', s, now)
    end
  end
end
return out
