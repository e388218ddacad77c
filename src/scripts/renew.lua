-- Renew many leases in one call (the watchdog's batch).
-- KEYS[i] lock hash; ARGV[3i-2] owner field, ARGV[3i-1] generation the owner
-- last wrote (see acquire.lua; empty if unknown), ARGV[3i] lease in ms.
-- A lease is extended only while the owner's field still exists and carries
-- that generation: a lock that was released, expired or taken over is never
-- brought back, and a renewal taken for an earlier state of a hold (sent
-- before a re-entry, a partial release, or a release and a new acquisition by
-- the same owner) cannot extend the lease that state set. A key that is no
-- longer a hash (overwritten by someone else) counts as gone for that lock
-- alone: pcall keeps its error from failing the other locks' renewals.
-- Returns a flat array of pairs for the locks not renewed, usually empty:
-- (1-based position, 0) when the lock is gone (the holder has lost it), or
-- (position, "<generation found>") when the generation differs (stale).
local out = {}
for i, key in ipairs(KEYS) do
    local field = ARGV[3 * i - 2]
    local v = redis.pcall('hmget', key, field, field .. ':gen')
    if type(v) ~= 'table' or v.err or not v[1] then
        out[#out + 1] = i
        out[#out + 1] = 0
    else
        local gen = v[2] or ''
        if gen == ARGV[3 * i - 1] then
            redis.call('pexpire', key, ARGV[3 * i])
        else
            out[#out + 1] = i
            out[#out + 1] = gen
        end
    end
end
return out
