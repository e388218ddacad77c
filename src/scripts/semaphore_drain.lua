-- Take every available permit (Redisson drainPermits), without handing out
-- permits when the count is below zero.
-- KEYS[1] the semaphore
-- Returns the permits taken.
local available = tonumber(redis.call('get', KEYS[1]) or 0)
if available <= 0 then
    return 0
end
redis.call('set', KEYS[1], '0', 'keepttl')
return available
