-- Acquire or re-enter a read or write lock (Redisson RReadWriteLock layout,
-- see the part above). Readers share the lock while mode is 'read' (or when
-- the reader's own thread holds the write lock); a writer holds it alone.
-- There is no upgrade: a reader asking for the write lock waits.
-- KEYS[1] the hash          KEYS[2] cancel marker of this request
-- KEYS[3..] keys of this owner's unsettled requests, set first (see
--           acquire.lua)
-- ARGV[1] lease in ms       ARGV[2] owner field (a writer's ends in ':write')
-- ARGV[3] hold count after this acquisition   ARGV[4] generation
-- ARGV[5] a reader's hold-key prefix ({<name>}:<uuid>:<thread>:rwlock_timeout),
--         '' for a writer
-- ARGV[6] a reader's thread's writer field (a writer may also read)
-- ARGV[7] {<name>} (see the part above)
-- ARGV[8] TTL in ms of the keys in KEYS[3..] (given only with them)
-- Returns nil when acquired, -3 when cancelled already, -4 when the caller
-- believes it holds the lock but its field is gone (or, for a reader, the
-- key of one of its holds has expired), else the PTTL.
-- Leases are never cut short: a re-entry extends the owner's earlier read
-- hold keys to at least its lease, and a writer's lease never ends before
-- its own thread's read holds.
for i = 3, #KEYS do
    redis.call('set', KEYS[i], '1', 'px', ARGV[8])
end
if redis.call('exists', KEYS[2]) == 1 then
    return -3
end
local count = tonumber(ARGV[3])
local mine = redis.call('hexists', KEYS[1], ARGV[2]) == 1
if count > 1 and not mine then
    return -4
end
local mode = redis.call('hget', KEYS[1], 'mode')
local reader = ARGV[5] ~= ''
local ok
if not mode then
    -- A hash without a mode is another kind of lock on this name: busy.
    ok = redis.call('exists', KEYS[1]) == 0
elseif reader then
    ok = mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[6]) == 1)
else
    ok = mode == 'write' and mine
end
if not ok then
    return redis.call('pttl', KEYS[1])
end
if not mode then
    redis.call('hset', KEYS[1], 'mode', reader and 'read' or 'write')
end
local lease = tonumber(ARGV[1])
if reader then
    for k = 1, count - 1 do
        local key = ARGV[5] .. ':' .. k
        local ttl = redis.call('pttl', key)
        if ttl == -2 then
            return -4
        end
        redis.call('pexpire', key, math.max(ttl, lease))
    end
end
redis.call('hset', KEYS[1], ARGV[2] .. ':gen', 'g' .. ARGV[4], ARGV[2], count)
if reader then
    redis.call('set', ARGV[5] .. ':' .. count, '1', 'px', lease)
    redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), lease))
elseif mode then
    -- A write re-entry: the thread may read too (a write-mode hash has no
    -- other readers).
    redis.call('pexpire', KEYS[1], math.max(lease, readers_ttl(KEYS[1], ARGV[7], nil)))
else
    redis.call('pexpire', KEYS[1], lease)
end
return nil
