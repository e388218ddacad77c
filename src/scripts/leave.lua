-- A process's last waiter of a reentrant lock gives up (after queue_lib.lua
-- and queue_wake.lua):
-- its process leaves the lock's queue (and the hash loses its mark once no
-- process is queued). If a release had already taken its entry (the wake-up
-- was for it, and nobody of it will use it) and the lock is free, the
-- wake-up goes on to the next queued process, or to every waiter: a waiter
-- that gives up never strands the others.
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] queue
-- ARGV[1] the process's wake-up channel (its entry)   ARGV[2] publish command
-- Returns 1 if a wake-up was passed on, else 0.
local left = redis.pcall('zrem', KEYS[3], ARGV[1])
if type(left) ~= 'number' then
    -- The ACL forbids the queue's commands: this process's tries could not
    -- queue it either, so there is nothing to leave.
    return 0
end
left = left == 1
if redis.call('exists', KEYS[1]) == 1 then
    if redis.call('exists', KEYS[3]) == 0 then
        redis.call('hdel', KEYS[1], QUEUED)
    end
    return 0
end
if left then
    return 0
end
wake_queued(KEYS[3], KEYS[2], ARGV[2])
return 1
