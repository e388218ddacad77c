-- Undo a fair-lock acquisition whose reply was lost (see cancel_acquire.lua
-- and the part above): the request also leaves the line, and if the lock is
-- free then, the first waiter in line is woken.
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] cancel marker
-- KEYS[4] the line    KEYS[5] the places   KEYS[6] the deadlines
-- ARGV[1] owner field ARGV[2] holds the owner had when it sent the request
-- ARGV[3] lease in ms the remaining holds need   ARGV[4] marker TTL in ms
-- ARGV[5] generation  ARGV[6] the publish command
-- Returns 1 if an acquisition was undone, 0 if there was none.
if redis.call('exists', KEYS[3]) == 1 then
    return 0
end
redis.call('set', KEYS[3], '1', 'px', ARGV[4])
leave_line(KEYS[4], KEYS[5], KEYS[6], ARGV[1])
local held = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
local want = tonumber(ARGV[2])
if held > want and want > 0 then
    redis.call('hset', KEYS[1], ARGV[1], want, ARGV[1] .. ':gen', ARGV[5])
    redis.call('pexpire', KEYS[1], ARGV[3])
    return 1
end
-- The lock is free, or will be once the acquisition is undone: the first
-- in line is told first (see release.lua), then the lock goes.
if held > want or redis.call('exists', KEYS[1]) == 0 then
    wake_first(KEYS[4], KEYS[5], KEYS[6], KEYS[2], ARGV[6])
end
if held > want then
    redis.call('del', KEYS[1])
    return 1
end
return 0
