-- A permit-expirable semaphore's housekeeping (see the part above): count
-- expired permits back,
-- then either set one permit's new lease or read the permits available.
-- KEYS[1] the semaphore   KEYS[2] its permits out   KEYS[3] its channel
-- KEYS[4] (lease update only) this update's key: set only by a later update
--         of the permit once this one's reply was lost
-- KEYS[5..] the keys of the permit's earlier updates whose reply was lost:
--         set here (TTL ARGV[4]) before anything else, so that a copy of
--         them still on its way can no longer apply
-- ARGV[1] the publish command
-- ARGV[2], ARGV[3] (lease update only) the permit's id, its new lease in ms
-- ARGV[4] with KEYS[5..]: their TTL in ms
-- Returns, for a lease update, 1 if set or 0 if the permit is not out (its
-- lease had run out, or it was released) or this update is a copy that
-- came too late (its sender gave up, and a later update ran); else the
-- permits available.
local now = now_ms()
reclaim(KEYS[1], KEYS[2], KEYS[3], ARGV[1], now)
if ARGV[2] then
    for i = 5, #KEYS do
        redis.call('set', KEYS[i], '1', 'px', ARGV[4])
    end
    if redis.call('exists', KEYS[4]) == 1 or not redis.call('zscore', KEYS[2], ARGV[2]) then
        return 0
    end
    redis.call('zadd', KEYS[2], string.format('%d', now + tonumber(ARGV[3])), ARGV[2])
    return 1
end
return tonumber(redis.call('get', KEYS[1]) or 0)
