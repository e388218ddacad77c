-- The reentrant lock's part of release.lua (prepended to it, after
-- queue_lib.lua): KEYS[4] is the lock's queue of waiting processes, the
-- unsettled keys start at KEYS[5]; a full release wakes one queued process
-- when the hash says some are queued, else it publishes '0' on the lock's
-- channel (one waiter per process wakes).
local FIRST_UNSETTLED = 5
local function wake_waiters(queued)
    if queued then
        wake_queued(KEYS[4], KEYS[2], ARGV[6])
    else
        redis.call(ARGV[6], KEYS[2], 0)
    end
end

