-- Take permits of a semaphore (Redisson RSemaphore layout: the string integer
-- at <name> is the number of permits available) and record them under this
-- request, so that their release, or the undo of an acquisition whose reply
-- was lost, returns them exactly once.
-- KEYS[1] the semaphore   KEYS[2] its permit records (redlease's own hash:
--         field <client-uuid>:<request id> = permits held)
-- KEYS[3] this request's cancel marker (set by the undo of a lost reply)
-- ARGV[1] permits wanted  ARGV[2] this request's record field
-- Returns -1 when acquired (also for a copy of a request that was: its
-- record is there), -3 when the request was cancelled already, 0 when too
-- few permits are available.
if redis.call('exists', KEYS[3]) == 1 then
    return -3
end
if redis.call('hexists', KEYS[2], ARGV[2]) == 1 then
    return -1
end
local available = tonumber(redis.call('get', KEYS[1]) or 0)
local wanted = tonumber(ARGV[1])
if available >= wanted then
    redis.call('decrby', KEYS[1], wanted)
    redis.call('hset', KEYS[2], ARGV[2], wanted)
    return -1
end
return 0
