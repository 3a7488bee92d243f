-- PROBE: leave open for half-open and grant the one probe lease cluster-wide.
-- KEYS[1] state; ARGV: name, floor, lease_ms, ttl_ms, channel
local floor = tonumber(ARGV[2])
local now = now_ms()
local s = load(KEYS[1], floor)
if s.st == 'closed' then return reply('closed', s, now) end
local changed = false
if s.st == 'open' then
  if now < s.ou then return reply('open', s, now) end
  s.st = 'half_open'; s.le = 0; bump(s, floor, now); changed = true
end
if s.le > now then
  if changed then save(KEYS[1], s, tonumber(ARGV[4])) end
  return reply('busy', s, now)
end
bump(s, floor, now)
s.le = now + tonumber(ARGV[3])
save(KEYS[1], s, tonumber(ARGV[4]))
local r = reply('granted', s, now)
publish(ARGV[5], ARGV[1], r)
return r
