-- Acquire or re-enter a fair lock (see the part above): the lock goes to
-- the first waiter in line; a caller that finds it busy (or free but not its
-- turn) takes a place at the end of the line, or renews the place it has.
-- KEYS[1] the lock hash   KEYS[2] cancel marker of this request
-- KEYS[3] the line        KEYS[4] the places   KEYS[5] the deadlines
-- KEYS[6..] keys of this owner's unsettled requests, set first (see
--           acquire.lua)
-- ARGV[1] lease in ms     ARGV[2] owner field   ARGV[3] hold count after it
-- ARGV[4] generation      ARGV[5] how long to keep the place, ms (0: do not
--         queue, a single try; a place this owner still has goes)
-- ARGV[6] '1' for the first try of a wait: a place this owner still has
--         from an earlier wait goes, and it queues at the end
-- ARGV[7] the lock's channel (a waiter's own is <channel>:<owner>)
-- ARGV[8] the publish command ('publish', or 'spublish' on a cluster)
-- ARGV[9] TTL in ms of the keys in KEYS[6..] (given only with them)
-- Returns nil when acquired, -3 when cancelled already, -4 when the caller
-- believes it holds the lock but its field is gone, else the holder's PTTL
-- (-2 when the lock is free but another waiter is first in line, who is
-- then told: the release may have told a place that went since, this
-- owner's own from a wait it gave up whose leave has not run yet).
for i = 6, #KEYS do
    redis.call('set', KEYS[i], '1', 'px', ARGV[9])
end
if redis.call('exists', KEYS[2]) == 1 then
    return -3
end
local now = now_ms()
local keep = tonumber(ARGV[5])
if keep == 0 or ARGV[6] == '1' then
    -- A single try, or a new wait: a place left from an earlier wait
    -- (whose leave did not get through) goes; a new wait queues at the end.
    leave_line(KEYS[3], KEYS[4], KEYS[5], ARGV[2])
end
local first = first_in_line(KEYS[3], KEYS[4], KEYS[5], now)
local count = tonumber(ARGV[3])
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hset', KEYS[1], ARGV[2] .. ':gen', ARGV[4], ARGV[2], count)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if count > 1 then
    return -4
end
if redis.call('exists', KEYS[1]) == 0 and (not first or first == ARGV[2]) then
    leave_line(KEYS[3], KEYS[4], KEYS[5], ARGV[2])
    redis.call('hset', KEYS[1], ARGV[2] .. ':gen', ARGV[4], ARGV[2], count)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if keep > 0 then
    redis.call('hset', KEYS[5], ARGV[2], string.format('%d', now + keep))
    -- Entries a Redisson client pruned (it does not know this hash) go with
    -- the hash once no redlease waiter has renewed a place for that long.
    local ttl = redis.call('pttl', KEYS[5])
    redis.call('pexpire', KEYS[5], math.max(ttl, keep + REDISSON_WAIT))
    local score = string.format('%d', now + keep + REDISSON_WAIT)
    if redis.call('zadd', KEYS[4], score, ARGV[2]) == 1 then
        redis.call('lrem', KEYS[3], '0', ARGV[2])
        redis.call('rpush', KEYS[3], ARGV[2])
    end
end
local ttl = redis.call('pttl', KEYS[1])
if ttl == -2 and first and first ~= ARGV[2] then
    -- Best effort, after this script's writes: where the ACL forbids the
    -- channel, the first waiter's own re-check finds the lock free.
    redis.pcall(ARGV[8], ARGV[7] .. ':' .. first, '0')
end
return ttl
