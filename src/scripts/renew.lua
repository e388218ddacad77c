-- Renew many leases in one call (the watchdog's batch), of every kind.
-- KEYS[i] lock hash; ARGV[4i-3] owner field, ARGV[4i-2] generation the owner
-- last wrote (see acquire.lua; empty if unknown), ARGV[4i-1] lease in ms,
-- ARGV[4i] a read hold's key prefix (see rw_lib.lua), else ''.
-- A renewal never shortens a lease (a re-entry may have set a longer one).
-- A lease is extended only while the owner's field still exists and carries
-- that generation: a lock that was released, expired or taken over is never
-- brought back, and a renewal taken for an earlier state of a hold (sent
-- before a re-entry, a partial release, or a release and a new acquisition by
-- the same owner) cannot extend the lease that state set. A read hold renews
-- its own hold keys (never other readers', so a dead reader's hold ends),
-- is gone once one of them has expired, and never shortens the hash's lease
-- (other readers may need longer). A key
-- that is no longer a hash (overwritten by someone else) counts as gone for
-- that lock alone: pcall keeps its error from failing the other locks'
-- renewals.
-- Returns a flat array of pairs for the locks not renewed, usually empty:
-- (1-based position, 0) when the lock is gone (the holder has lost it), or
-- (position, "<generation found>") when the generation differs (stale).
local out = {}
for i, key in ipairs(KEYS) do
    local field = ARGV[4 * i - 3]
    local v = redis.pcall('hmget', key, field, field .. ':gen')
    if type(v) ~= 'table' or v.err or not v[1] then
        out[#out + 1] = i
        out[#out + 1] = 0
    else
        local gen = v[2] or ''
        local want = ARGV[4 * i - 2]
        if gen == want or gen == 'g' .. want then
            local prefix = ARGV[4 * i]
            local lease = tonumber(ARGV[4 * i - 1])
            if prefix == '' then
                redis.call('pexpire', key, math.max(redis.call('pttl', key), lease))
            else
                -- A read hold whose key has expired has lost its lease
                -- (Redisson's readers count it dead): gone.
                local alive = true
                for k = 1, tonumber(v[1]) or 0 do
                    local hold = prefix .. ':' .. k
                    local ttl = redis.call('pttl', hold)
                    if ttl == -2 then
                        alive = false
                    else
                        redis.call('pexpire', hold, math.max(ttl, lease))
                    end
                end
                if alive then
                    redis.call('pexpire', key, math.max(redis.call('pttl', key), lease))
                else
                    out[#out + 1] = i
                    out[#out + 1] = 0
                end
            end
        else
            out[#out + 1] = i
            out[#out + 1] = gen
        end
    end
end
return out
