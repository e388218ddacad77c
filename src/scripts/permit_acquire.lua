-- Take one permit of a permit-expirable semaphore (see the part above).
-- Expired permits are counted back first.
-- KEYS[1] the semaphore   KEYS[2] its permits out   KEYS[3] its channel
-- KEYS[4] this request's cancel marker (set by the undo of a lost reply)
-- ARGV[1] the lease in ms ARGV[2] the permit's id   ARGV[3] the publish command
-- Returns -1 when acquired (also for a copy of a request that was: its
-- permit is out), -3 when the request was cancelled already, -2
-- when none is available and none out will expire, else the ms until the
-- first permit out comes back.
if redis.call('exists', KEYS[4]) == 1 then
    return -3
end
if redis.call('zscore', KEYS[2], ARGV[2]) then
    return -1
end
local now = now_ms()
reclaim(KEYS[1], KEYS[2], KEYS[3], ARGV[3], now)
local available = tonumber(redis.call('get', KEYS[1]) or 0)
if available >= 1 then
    redis.call('decrby', KEYS[1], '1')
    redis.call('zadd', KEYS[2], string.format('%d', now + tonumber(ARGV[1])), ARGV[2])
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl)
    end
    return -1
end
local first = redis.call('zrange', KEYS[2], '0', '0', 'withscores')
-- Redisson's permits taken without a lease carry 922337203685477: never.
-- (It comes back once the millisecond of its score has passed.)
if first[2] and tonumber(first[2]) < 922337203685477 then
    return math.max(0, tonumber(first[2]) - now + 1)
end
return -2
