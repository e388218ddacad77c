-- Delete a lock whoever holds it and wake a waiter (Redisson forceUnlock).
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] latch of this request
-- ARGV[1] latch TTL in ms   ARGV[2] the publish command ('publish' or
-- 'spublish', see release.lua)   ARGV[3] the message: '0' (one waiter per
-- process), '1' for a read-write lock (every waiter)
-- ARGV[4] a read-write lock's mode ('read', 'write') to delete it only in
-- (Redisson's RReadLock / RWriteLock forceUnlock), or '' for any
-- Returns 1 if a lock was deleted, else 0, or an error (nothing deleted)
-- when the key is not a hash. A retry of the same request (same latch)
-- after a lost reply returns the first run's answer.
local done = redis.call('get', KEYS[3])
if done then
    return tonumber(done)
end
local deleted = 0
local held = redis.call('exists', KEYS[1]) == 1
if held then
    -- A lock is a hash: a key of another type is no lock to delete.
    -- (Another refusal, say an ACL without HEXISTS, tells nothing: the
    -- key is taken for a lock, as before.)
    local probe = redis.pcall('hexists', KEYS[1], 'mode')
    if type(probe) == 'table' and probe.err and string.find(probe.err, 'WRONGTYPE', 1, true) then
        return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a lock (not a hash): '
            .. 'force_unlock deletes locks only; delete the key itself if it must go')
    end
end
if held and ARGV[4] ~= '' then
    held = redis.call('hget', KEYS[1], 'mode') == ARGV[4]
end
if held then
    -- Publish first: without the channel in its ACL the user stops here
    -- with nothing changed (subscribers see the message after the script).
    redis.call(ARGV[2], KEYS[2], ARGV[3])
    redis.call('del', KEYS[1])
    deleted = 1
end
redis.call('set', KEYS[3], deleted, 'px', ARGV[1])
return deleted
