-- A fair-lock waiter gives up (its wait ended, an error, a panic): it leaves
-- the line, and if the lock is free, the first waiter left is woken. Once
-- only: the request's marker, which the owner's next operation on the lock
-- also sets, makes a copy of it (or a retry) that comes after a later
-- place of the same owner leave that place alone.
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] the line
-- KEYS[4] the places  KEYS[5] the deadlines     KEYS[6] this request's marker
-- ARGV[1] owner field ARGV[2] the publish command   ARGV[3] marker TTL in ms
-- Returns 1 if it left the line, 0 if the marker said it had run already.
if redis.call('exists', KEYS[6]) == 1 then
    return 0
end
redis.call('set', KEYS[6], '1', 'px', ARGV[3])
leave_line(KEYS[3], KEYS[4], KEYS[5], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then
    wake_first(KEYS[3], KEYS[4], KEYS[5], KEYS[2], ARGV[2])
end
return 1
