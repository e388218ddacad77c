-- Delete a lock whoever holds it and wake a waiter (Redisson forceUnlock).
-- KEYS[1] lock hash   KEYS[2] release channel
-- Returns 1 if a lock was deleted, else 0.
if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', KEYS[2], 0)
    return 1
end
return 0
