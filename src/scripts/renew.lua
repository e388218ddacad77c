-- Renew many leases in one call (the watchdog's batch).
-- KEYS[i] lock hash; ARGV[2i-1] owner field, ARGV[2i] lease in ms.
-- A lease is extended only while the owner's field still exists, so a lock
-- that was released, expired or taken over is never brought back. A key that
-- is no longer a hash (overwritten by someone else) counts as gone for that
-- lock alone: pcall keeps its error from failing the other locks' renewals.
-- Returns the (1-based) positions of the locks that are gone (the holder has
-- lost them); usually an empty array, so the reply stays small.
local gone = {}
for i, key in ipairs(KEYS) do
    if redis.pcall('hexists', key, ARGV[2 * i - 1]) == 1 then
        redis.call('pexpire', key, ARGV[2 * i])
    else
        gone[#gone + 1] = i
    end
end
return gone
