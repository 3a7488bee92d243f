-- BUDGET: apply a replica's token changes to the shared bucket, refilled by Redis time.
-- KEYS[1] budget; ARGV: delta, floor_per_min, max_tokens, ttl_ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(v[1] or ARGV[3])
local ts = tonumber(v[2] or tostring(now))
if now > ts then tokens = math.min(cap, tokens + (now - ts) * tonumber(ARGV[2]) / 60000) end
tokens = math.max(0, math.min(cap, tokens + tonumber(ARGV[1])))
redis.call('HSET', KEYS[1], 't', string.format('%.6f', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return string.format('%.6f', tokens)
