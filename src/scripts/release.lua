-- Release one hold of a reentrant lock (Redisson RLock layout), or of a
-- fair lock: the part prepended to this one (release_plain.lua,
-- fair_release.lua) says where the unsettled keys start (FIRST_UNSETTLED),
-- whom a full release wakes (wake_waiters, a function; nil: a queued
-- process through wake_queued if the hash marks some, else every waiter
-- on the lock's channel) and whether it may hand the lock over (grant_allowed, a
-- function, or nil where it may not).
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] unlock latch of this request
-- KEYS[FIRST_UNSETTLED..] keys of this owner's unsettled requests (see
--           acquire.lua), set here so they can no longer apply
-- ARGV[1] owner field ARGV[2] holds left after this release (0 = full release;
--         decimal with no leading zero, compared as text)
-- ARGV[3] lease in ms (re-applied while holds remain)   ARGV[4] latch TTL in ms
-- ARGV[5] generation (this request's id, see acquire.lua); used only
--         while holds remain ('' in a full release)
-- ARGV[6] the publish command: 'publish', or 'spublish' (sharded pub/sub on
--         a cluster, as Redisson's getPublishCommand)
-- ARGV[7] TTL in ms of the unsettled keys (given with them, and with ARGV[8..])
-- ARGV[8..11], with the waiter's cancel marker as the last key: a waiting
--         thread of this client that a full release may hand the lock to
--         (see release_plain.lua)
-- Returns nil when the field is gone (not held: expired or deleted), 0 when
-- holds remain, 1 when the lock was deleted and its waiters told, 2 when it
-- was handed to the waiter of ARGV[8] (nobody is told: it is still held;
-- {2, token} for a fenced lock's waiter, see release_plain.lua; a retry
-- answers 2).
-- A retry or a late copy of the same request (same latch) returns the first
-- answer again, "not held" included, so a release whose reply was lost is
-- never applied twice nor reported "not held", and a copy that arrives after
-- the owner took the lock again cannot touch that later hold; an owner's
-- later operation sets the latch of its unsettled releases first, too.
for i = FIRST_UNSETTLED, LAST_UNSETTLED do
    redis.call('set', KEYS[i], '1', 'px', ARGV[7])
end
local done = redis.call('get', KEYS[3])
if done then
    if done == 'n' then
        return nil
    end
    return tonumber(done)
end
if ARGV[2] ~= '0' then
    if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
        redis.call('set', KEYS[3], 'n', 'px', ARGV[4])
        return nil
    end
    redis.call('hset', KEYS[1], ARGV[1], ARGV[2], ARGV[1] .. ':gen', ARGV[5])
    redis.call('pexpire', KEYS[1], ARGV[3])
    redis.call('set', KEYS[3], '0', 'px', ARGV[4])
    return 0
end
-- The owner's count, and whether redlease waiters are queued (see
-- queue_lib.lua; the fair lock's hash never says so).
local state = redis.call('hmget', KEYS[1], ARGV[1], 'redlease:waiting')
if not state[1] then
    redis.call('set', KEYS[3], 'n', 'px', ARGV[4])
    return nil
end
local grant = grant_allowed ~= nil and grant_allowed()
-- A fenced lock's waiter takes the next token, before anything is handed
-- over: where that fails (the token key is not a number) or gives no token
-- (a negative number, which acquire.lua refuses too), the lock is released
-- as usual.
local token
if grant and GRANT_TOKEN then
    token = redis.pcall('incr', GRANT_TOKEN)
    grant = type(token) == 'number' and token >= 0
end
if grant then
    -- The releasing owner's fields go; the waiter's come, with its lease
    -- (the queue's mark stays: queued processes still wait).
    redis.call('hdel', KEYS[1], ARGV[1], ARGV[1] .. ':gen')
    redis.call('hset', KEYS[1], ARGV[8] .. ':gen', ARGV[9], ARGV[8], '1')
    redis.call('pexpire', KEYS[1], ARGV[10])
    if ARGV[11] ~= '' then
        redis.pcall('zrem', KEYS[4], ARGV[11])
    end
    redis.call('set', KEYS[3], '2', 'px', ARGV[4])
    if token then
        return {2, token}
    end
    return 2
end
-- Publish before deleting: a user whose ACL lacks the channel stops the
-- script here with nothing changed. Subscribers get the message only after
-- the script has run, so no waiter can see the lock still held.
if wake_waiters then
    wake_waiters()
elseif state[2] then
    wake_queued(KEYS[4], KEYS[2], ARGV[6])
else
    redis.call(ARGV[6], KEYS[2], '0')
end
-- The owner's fields (and the queue's mark) are the only ones a lock hash
-- has (an acquisition writes only to a hash that is absent or holds the
-- acquirer's own field): DEL, as Redisson's release, which costs Redis less
-- than removing the fields one by one.
redis.call('del', KEYS[1])
redis.call('set', KEYS[3], '1', 'px', ARGV[4])
return 1
