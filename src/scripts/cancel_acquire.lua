-- Undo an acquisition whose reply was lost, so a caller told "failed" never
-- leaves the lock held in its name. Run by the watchdog thread, retried until
-- it has run once.
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] cancel marker of the request
-- ARGV[1] owner field ARGV[2] holds the owner had when it sent the request
-- ARGV[3] lease in ms the remaining holds need (re-applied while holds remain)
-- ARGV[4] marker TTL in ms   ARGV[5] generation (this request's id)
-- ARGV[6] the publish command ('publish' or 'spublish', see release.lua)
-- If the marker exists, a later operation of the same owner already set it
-- (and wrote the count absolutely), so there is nothing to undo. Otherwise no
-- operation of that owner ran since the request, and the count is either the
-- one it had (the request never ran) or one more (it ran): undo that one.
-- The marker makes a copy of the request that reaches Redis later a no-op.
-- Returns 1 if an acquisition was undone, 0 if there was none.
if redis.call('exists', KEYS[3]) == 1 then
    return 0
end
redis.call('set', KEYS[3], '1', 'px', ARGV[4])
local held = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
local want = tonumber(ARGV[2])
if held <= want then
    return 0
end
if want > 0 then
    redis.call('hset', KEYS[1], ARGV[1], want, ARGV[1] .. ':gen', ARGV[5])
    redis.call('pexpire', KEYS[1], ARGV[3])
else
    redis.call(ARGV[6], KEYS[2], '0')
    redis.call('del', KEYS[1])
end
return 1
