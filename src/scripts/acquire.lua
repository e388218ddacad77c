-- Acquire or re-enter a reentrant lock (Redisson RLock layout), fenced or not.
-- KEYS[1] lock hash          KEYS[2] cancel marker of this request
-- KEYS[3] fenced only: the token key redisson_lock_token:{<name>} (Redisson's
--         RFencedLock), incremented on every acquisition, re-entry included,
--         and never given a TTL
-- KEYS[3..] (KEYS[4..] when fenced) cancel markers / unlock latches of this
--           owner's earlier requests whose reply was lost and that are not
--           settled yet: set here, so a copy of them still on its way can no
--           longer apply
-- ARGV[1] lease in ms        ARGV[2] owner field <client-uuid>:<thread-id>
-- ARGV[3] generation: this request's id, written to the field <owner>:gen so
--         that a renewal taken for an earlier state of the hold cannot apply
-- ARGV[4] hold count after this acquisition (the caller's local count + 1),
--         in decimal with no leading zero: compared as text (a number
--         read from text costs Redis a strtod on every call); none for '1'
--         when no argument follows (each argument costs Redis about 1,200
--         instructions, more than the Lua that reads it)
-- ARGV[5] '1' when fenced, else '0' (or none, when no argument follows)
-- ARGV[6] TTL in ms of the earlier requests' keys (given with them, and
--         whenever ARGV[7] is)
-- ARGV[7] a waiter that listens for its process's wake-up (queue_lib.lua):
--         'q' to queue its process if busy, and keep it queued if acquired
--         (other waiters of the process still wait), 'l' the same but leave
--         the queue if acquired; then the last key is the queue
-- ARGV[8] with ARGV[7]: the process's wake-up channel (its queue entry)
-- ARGV[9] with ARGV[7]: the longest the caller waits before it tries again,
--         in ms (its entry outlives that)
-- Returns nil when acquired ({token} when fenced), -3 when the caller already
-- cancelled this request, -4 when the caller believes it holds the lock
-- (re-entry) but its field is gone (its holds were lost: lease ran out,
-- deleted) -- nothing is written and it must acquire afresh --, else the
-- holder's remaining TTL in ms (PTTL; -1 if the holder set no lease).
-- The count is written absolutely (HSET, not HINCRBY), so running the same
-- request twice after a lost reply cannot count one acquisition twice (a
-- fenced one takes a new token: tokens only grow).
local count = ARGV[4] or '1'
local fenced = ARGV[5] == '1'
local first = 3
if fenced then
    first = 4
end
local last = #KEYS
local queue
if ARGV[7] then
    queue = KEYS[last]
    last = last - 1
end
for i = first, last do
    redis.call('set', KEYS[i], '1', 'px', ARGV[6])
end
-- Queues this process (its entry outliving the caller's next try: the
-- holder's lease or the caller's wait, whichever ends first) and marks the
-- hash, so that a release wakes a queued process rather than all waiters.
-- Left out where the ACL forbids it: the release then wakes everyone.
-- Made only for a waiter's request: a function made on every call is
-- allocated and collected by Redis on every call.
local join
if queue then
    join = function(wait, mark)
        -- Redis's clock; none where the ACL forbids TIME: not queued.
        local t = redis.pcall('time')
        if type(t) ~= 'table' or t.err then
            return
        end
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local until_ms = now + wait + 2000
        local added = redis.pcall('zadd', queue, until_ms, ARGV[8])
        if type(added) == 'table' and added.err then
            return
        end
        if redis.call('pttl', queue) < wait + 2000 then
            redis.call('pexpire', queue, wait + 2000)
        end
        if mark then
            redis.call('hset', KEYS[1], QUEUED, '1')
        end
    end
end
-- One call tells the usual case: the lock is free and this request was not
-- cancelled.
local mine = redis.call('exists', KEYS[1], KEYS[2]) == 0
if mine then
    if count ~= '1' then
        return -4
    end
else
    if redis.call('exists', KEYS[2]) == 1 then
        return -3
    end
    mine = redis.call('hexists', KEYS[1], ARGV[2]) == 1
end
if mine then
    -- A fenced lock's token first: a token key that is not a number, or a
    -- negative one (someone else wrote it: tokens never are), fails the
    -- call here, with nothing of the lock written and the key as it was.
    local token
    if fenced then
        token = redis.pcall('incr', KEYS[3])
        if type(token) == 'table' and token.err then
            return redis.error_reply('ERR the fencing token key ' .. KEYS[3]
                .. ' does not hold a whole number (' .. token.err .. '): '
                .. 'delete the key or set it to the last token handed out')
        end
        if token < 0 then
            redis.pcall('decr', KEYS[3])
            return redis.error_reply('ERR the fencing token key ' .. KEYS[3]
                .. ' holds a negative number; fencing tokens are never negative: '
                .. 'delete the key or set it to the last token handed out')
        end
    end
    if ARGV[7] == 'q' then
        -- Other waiters of this process still wait: it stays queued, and
        -- the hash says so.
        redis.call('hset', KEYS[1], ARGV[2] .. ':gen', ARGV[3], ARGV[2], count, QUEUED, '1')
    else
        redis.call('hset', KEYS[1], ARGV[2] .. ':gen', ARGV[3], ARGV[2], count)
    end
    redis.call('pexpire', KEYS[1], ARGV[1])
    if queue then
        if ARGV[7] == 'q' then
            join(math.max(tonumber(ARGV[1]), tonumber(ARGV[9])), false)
        else
            redis.pcall('zrem', queue, ARGV[8])
            -- Other processes still queued: this hold's release wakes one.
            local n = redis.pcall('zcard', queue)
            if type(n) == 'number' and n > 0 then
                redis.call('hset', KEYS[1], QUEUED, '1')
            end
        end
    end
    if token then
        return {token}
    end
    return nil
end
if count ~= '1' then
    return -4
end
local ttl = redis.call('pttl', KEYS[1])
if queue then
    local wait = tonumber(ARGV[9])
    if ttl > 0 and ttl < wait then
        wait = ttl
    end
    join(wait, true)
end
return ttl
