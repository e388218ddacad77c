-- Count-down latch: delete it; waiters wake (its count is 0 from now on).
-- KEYS[1] latch key   KEYS[2] its channel   ARGV[1] the publish command
-- Returns 1 if a latch was deleted (and '1' published), else 0.
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[1], KEYS[2], '1')
    return 1
end
return 0
