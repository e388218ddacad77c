-- The reentrant lock's part of release.lua (prepended to it): the unsettled
-- keys start at KEYS[4], and a full release publishes '0' on the lock's
-- channel (one waiter per process wakes).
local FIRST_UNSETTLED = 4
local function wake_waiters()
    redis.call(ARGV[6], KEYS[2], 0)
end

