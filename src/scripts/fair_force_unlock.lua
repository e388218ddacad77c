-- Delete a fair lock whoever holds it and wake the first waiter in line.
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] latch of this request
-- KEYS[4] the line    KEYS[5] the places   KEYS[6] the deadlines
-- ARGV[1] latch TTL in ms   ARGV[2] the publish command
-- Returns 1 if a lock was deleted, else 0 (a retry returns the first answer),
-- or an error (nothing deleted) when the key is not a hash.
local done = redis.call('get', KEYS[3])
if done then
    return tonumber(done)
end
-- Publish first (see release.lua): the first in line does not depend on
-- the lock.
local held = redis.call('exists', KEYS[1])
if held == 1 then
    -- A lock is a hash: a key of another type is no lock to delete.
    -- (Another refusal, say an ACL without HEXISTS, tells nothing: the
    -- key is taken for a lock, as before.)
    local probe = redis.pcall('hexists', KEYS[1], 'mode')
    if type(probe) == 'table' and probe.err and string.find(probe.err, 'WRONGTYPE', 1, true) then
        return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a lock (not a hash): '
            .. 'force_unlock deletes locks only; delete the key itself if it must go')
    end
    wake_first(KEYS[4], KEYS[5], KEYS[6], KEYS[2], ARGV[2])
end
local deleted = redis.call('del', KEYS[1])
redis.call('set', KEYS[3], deleted, 'px', ARGV[1])
return deleted
