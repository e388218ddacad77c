-- Undo an acquisition whose reply was lost, so a caller told "failed" never
-- leaves the lock held in its name.
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] cancel marker of the request
-- ARGV[1] owner field ARGV[2] holds the caller really has (its local count)
-- ARGV[3] lease in ms (re-applied while holds remain)   ARGV[4] marker TTL in ms
-- The marker makes a copy of the request that reaches Redis later a no-op.
-- Returns 1 if an acquisition was undone, 0 if there was none.
redis.call('set', KEYS[3], 1, 'px', ARGV[4])
local held = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
local want = tonumber(ARGV[2])
if held <= want then
    return 0
end
if want > 0 then
    redis.call('hset', KEYS[1], ARGV[1], want)
    redis.call('pexpire', KEYS[1], ARGV[3])
else
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[2], 0)
end
return 1
