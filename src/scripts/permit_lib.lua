-- Shared by the permit-expirable semaphore's scripts (prepended to each).
-- Redisson's RPermitExpirableSemaphore layout: <name> holds the permits
-- available, {<name>}:timeout the permits out (member: the permit's 16-byte
-- id; score: its expiry, epoch ms). Time is Redis's own clock (TIME), so
-- clients' clocks do not matter among redlease clients.

local function now_ms()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Counts permits whose lease ran out back (up to 1000 a call) and tells
-- the waiters the new total when there is one to take. A permit's score is
-- the millisecond it was taken in plus its lease: it was taken at some
-- point of that millisecond, so its lease may still run during the
-- millisecond its score names. It comes back once that one has passed
-- (as a key's PEXPIRE does), never before its guard's bound.
local function reclaim(name, out, channel, publish, now)
    local expired = redis.call('zrangebyscore', out, '0', string.format('(%d', now),
        'limit', '0', '1000')
    if #expired > 0 then
        local total = tonumber(redis.call('get', name) or 0) + #expired
        if total > 0 then
            redis.call(publish, channel, total)
        end
        redis.call('zrem', out, unpack(expired))
        redis.call('incrby', name, #expired)
    end
end

