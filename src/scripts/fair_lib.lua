-- Shared by the fair lock's scripts (prepended to each of them). Redisson's
-- RFairLock layout: the lock hash <name> as RLock's; the line of waiters
-- redisson_lock_queue:{<name>} (a list of owner fields, first come first);
-- their places redisson_lock_timeout:{<name>} (a sorted set: owner -> the
-- epoch ms until which the place is kept). A release wakes only the first
-- waiter in line, on its own channel redisson_lock__channel:{<name>}:<owner>.
-- redlease keeps a waiter's place for a few seconds and the waiter renews
-- it while it waits, so a waiter that crashed loses its place within those
-- seconds (Redisson keeps one up to 5 minutes, and places chain). Time is
-- Redis's own clock. A redlease waiter's deadline is in redlease's own hash
-- redlease_fair_alive:{<name>} (owner -> epoch ms); its score in the places
-- is that deadline plus Redisson's default wait (5 minutes), because every
-- Redisson acquisition moves all scores earlier by its wait: the score keeps
-- the place alive for Redisson, the hash says when it really ends.

local function now_ms()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- What Redisson's acquisitions take off every score (its default wait).
local REDISSON_WAIT = 300000

-- Drops the waiters at the head of the line whose place has run out (or
-- that have none); returns the first waiter left, if any.
local function first_in_line(queue, places, alive, now)
    while true do
        local head = redis.call('lindex', queue, '0')
        if not head then
            return nil
        end
        local until_ms = redis.call('hget', alive, head) or redis.call('zscore', places, head)
        if until_ms and tonumber(until_ms) > now then
            return head
        end
        redis.call('lpop', queue)
        redis.call('zrem', places, head)
        redis.call('hdel', alive, head)
    end
end

-- Tells the first waiter in line, on its own channel, that the lock is free.
local function wake_first(queue, places, alive, channel, publish)
    local head = first_in_line(queue, places, alive, now_ms())
    if head then
        redis.call(publish, channel .. ':' .. head, '0')
    end
end

-- Takes `owner` out of the line.
local function leave_line(queue, places, alive, owner)
    redis.call('zrem', places, owner)
    redis.call('hdel', alive, owner)
    redis.call('lrem', queue, '0', owner)
end

