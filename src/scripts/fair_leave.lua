-- A fair-lock waiter gives up (its wait ended, an error, a panic): it leaves
-- the line, and if the lock is free, the first waiter left is woken.
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] the line
-- KEYS[4] the places
-- ARGV[1] owner field ARGV[2] the publish command
-- Returns 1.
leave_line(KEYS[3], KEYS[4], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then
    wake_first(KEYS[3], KEYS[4], KEYS[2], ARGV[2])
end
return 1
