-- Count-down latch: one count down. At zero (or below: a latch counted down
-- past zero, or never set) the key goes; reaching zero publishes '0'
-- (ZERO_COUNT), which wakes every waiter.
-- KEYS[1] latch key   KEYS[2] its channel   ARGV[1] the publish command
-- Returns the count left (0 when it reached zero or was not set).
local v = redis.call('decr', KEYS[1])
if v <= 0 then
    redis.call('del', KEYS[1])
end
if v == 0 then
    redis.call(ARGV[1], KEYS[2], '0')
end
if v < 0 then
    return 0
end
return v
