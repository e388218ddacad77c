-- Add (or, below zero, take away) permits of a semaphore, either kind
-- (Redisson's release(n) and addPermits). INCRBY keeps a TTL set by
-- trySetPermits(n, ttl) (Redisson's addPermits SET clears it).
-- KEYS[1] the semaphore   KEYS[2] its channel
-- ARGV[1] the change      ARGV[2] the publish command
-- Returns the new total; publishes it when above zero (a waiter may go;
-- Redisson's listeners take no negative count).
local total = tonumber(redis.call('get', KEYS[1]) or 0) + tonumber(ARGV[1])
if total > 0 then
    redis.call(ARGV[2], KEYS[2], total)
end
redis.call('incrby', KEYS[1], ARGV[1])
return total
