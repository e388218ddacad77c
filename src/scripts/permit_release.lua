-- Return one permit of a permit-expirable semaphore by id: a release, or the
-- undo of an acquisition whose reply was lost. Runs once whatever the number
-- of copies: the permit leaves the set with the first, and its latch
-- answers the copies that follow while it lives.
-- KEYS[1] the semaphore   KEYS[2] its channel   KEYS[3] its permits out
-- (the order of semaphore_release.lua)
-- KEYS[4] this release's latch
-- KEYS[5] undo only: the request's cancel marker, set first so that a copy
--         of the acquisition still on its way can no longer apply
-- ARGV[1] the permit's id ARGV[2] the publish command
-- ARGV[3] the latch's TTL in ms   ARGV[4] undo only: the marker's TTL in ms
-- Returns 1 if released, 2 if it was out but its lease had run out (counted
-- back now), 0 if it was not out (released, or counted back already).
if #KEYS == 5 then
    redis.call('set', KEYS[5], '1', 'px', ARGV[4])
end
local done = redis.call('get', KEYS[4])
if done then
    return tonumber(done)
end
local expiry = redis.call('zscore', KEYS[3], ARGV[1])
if not expiry then
    return 0
end
local now = now_ms()
local total = tonumber(redis.call('get', KEYS[1]) or 0) + 1
if total > 0 then
    redis.call(ARGV[2], KEYS[2], total)
end
redis.call('zrem', KEYS[3], ARGV[1])
redis.call('incrby', KEYS[1], '1')
local result = 1
-- Expired: the millisecond its score names has passed (see reclaim).
if tonumber(expiry) < now then
    result = 2
end
redis.call('set', KEYS[4], result, 'px', ARGV[3])
return result
