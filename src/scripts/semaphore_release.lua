-- Return the permits one acquisition recorded (see semaphore_acquire.lua):
-- the release of a permit guard, or the undo of an acquisition whose reply
-- was lost. Runs once whatever the number of copies: the record goes with
-- the first, and its latch answers the copies that follow while it lives.
-- KEYS[1] the semaphore   KEYS[2] its channel redisson_sc:{<name>}
-- KEYS[3] its permit records   KEYS[4] this release's latch
-- KEYS[5] undo only: the request's cancel marker, set first so that a copy
--         of the acquisition still on its way can no longer apply
-- ARGV[1] the record field   ARGV[2] the publish command
-- ARGV[3] the latch's TTL in ms   ARGV[4] undo only: the marker's TTL in ms
-- Returns 1 if the permits were returned (by this copy or, as the latch
-- says, an earlier one; the new total is published when above zero, as
-- Redisson's release does), 0 if there was no record.
if #KEYS == 5 then
    redis.call('set', KEYS[5], '1', 'px', ARGV[4])
end
if redis.call('exists', KEYS[4]) == 1 then
    return 1
end
local held = redis.call('hget', KEYS[3], ARGV[1])
if not held then
    return 0
end
local total = tonumber(redis.call('get', KEYS[1]) or 0) + tonumber(held)
-- Publish first: without the channel in its ACL the user stops here with
-- nothing changed.
if total > 0 then
    redis.call(ARGV[2], KEYS[2], total)
end
redis.call('hdel', KEYS[3], ARGV[1])
redis.call('incrby', KEYS[1], held)
redis.call('set', KEYS[4], '1', 'px', ARGV[3])
return 1
