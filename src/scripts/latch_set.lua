-- Count-down latch (Redisson RCountDownLatch layout): set the count if the
-- latch does not exist.
-- KEYS[1] latch key   KEYS[2] its channel
-- ARGV[1] count       ARGV[2] the publish command ('publish' or 'spublish')
-- Returns 1 if set (and '1', NEW_COUNT, published), 0 if the latch exists.
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('set', KEYS[1], ARGV[1])
    redis.call(ARGV[2], KEYS[2], '1')
    return 1
end
return 0
