-- Set a semaphore's permits if it does not exist (Redisson trySetPermits).
-- KEYS[1] the semaphore   KEYS[2] its channel
-- ARGV[1] permits         ARGV[2] the publish command
-- Returns 1 if set (and the count published when above zero), else 0.
if redis.call('exists', KEYS[1]) == 1 then
    return 0
end
if tonumber(ARGV[1]) > 0 then
    redis.call(ARGV[2], KEYS[2], ARGV[1])
end
redis.call('set', KEYS[1], ARGV[1])
return 1
