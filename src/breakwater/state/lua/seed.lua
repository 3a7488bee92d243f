-- SEED: after Redis lost a key, a replica's local open state is written back once.
-- KEYS[1] state; ARGV: name, floor, remaining_ms, opens, reason, ttl_ms, channel
local floor = tonumber(ARGV[2])
local now = now_ms()
local s = load(KEYS[1], floor)
if not s.fresh then return reply('state', s, now) end
bump(s, floor, now)
s.st = 'open'; s.ou = now + tonumber(ARGV[3]); s.op = tonumber(ARGV[4]); s.rs = ARGV[5]; s.le = 0
save(KEYS[1], s, tonumber(ARGV[6]))
local r = reply('state', s, now)
publish(ARGV[7], ARGV[1], r)
return r
