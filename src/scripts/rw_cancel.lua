-- Undo a read or write acquisition whose reply was lost (see
-- cancel_acquire.lua and the part above).
-- KEYS[1] the hash   KEYS[2] channel   KEYS[3] cancel marker of the request
-- ARGV[1] owner field ARGV[2] holds the owner had when it sent the request
-- ARGV[3] lease in ms the remaining holds need   ARGV[4] marker TTL in ms
-- ARGV[5] generation  ARGV[6] the publish command
-- ARGV[7] a reader's hold-key prefix, '' for a writer   ARGV[8] {<name>}
-- Returns 1 if an acquisition was undone, 0 if there was none, 2 if the
-- holds it would leave are gone (one of their keys has expired).
if redis.call('exists', KEYS[3]) == 1 then
    return 0
end
redis.call('set', KEYS[3], '1', 'px', ARGV[4])
local held = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
local want = tonumber(ARGV[2])
if held <= want then
    return 0
end
if want > 0 then
    -- A hold key gone already: the remaining holds are gone (2).
    if not keep_holds(KEYS[1], ARGV[1], held, want, ARGV[5], ARGV[3], ARGV[7], ARGV[8]) then
        return 2
    end
else
    drop_holds(KEYS[1], KEYS[2], ARGV[1], held, ARGV[7], ARGV[8], ARGV[6])
end
return 1
