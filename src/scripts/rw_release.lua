-- Release one hold of a read or write lock (see the part above).
-- KEYS[1] the hash   KEYS[2] channel redisson_rwlock:{<name>}
-- KEYS[3] unlock latch of this request   KEYS[4..] unsettled keys (see
--         release.lua)
-- ARGV[1] owner field  ARGV[2] holds left after it (0: full release)
-- ARGV[3] lease in ms (re-applied while holds remain)  ARGV[4] latch TTL in ms
-- ARGV[5] generation   ARGV[6] the publish command
-- ARGV[7] a reader's hold-key prefix, '' for a writer   ARGV[8] {<name>}
-- ARGV[9] TTL in ms of the keys in KEYS[4..] (given only with them)
-- Returns nil when the field is gone (or, for a reader keeping holds, one of
-- their keys has expired: those holds are gone), 0 when holds remain, 1 when the
-- owner's holds are all released; a retry or late copy returns the first
-- answer (see release.lua).
for i = 4, #KEYS do
    redis.call('set', KEYS[i], '1', 'px', ARGV[9])
end
local done = redis.call('get', KEYS[3])
if done then
    if done == 'n' then
        return nil
    end
    return tonumber(done)
end
local held = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not held then
    redis.call('set', KEYS[3], 'n', 'px', ARGV[4])
    return nil
end
local left = tonumber(ARGV[2])
if left > 0 then
    if not keep_holds(KEYS[1], ARGV[1], held, left, ARGV[5], ARGV[3], ARGV[7], ARGV[8]) then
        redis.call('set', KEYS[3], 'n', 'px', ARGV[4])
        return nil
    end
    redis.call('set', KEYS[3], '0', 'px', ARGV[4])
    return 0
end
drop_holds(KEYS[1], KEYS[2], ARGV[1], held, ARGV[7], ARGV[8], ARGV[6])
redis.call('set', KEYS[3], '1', 'px', ARGV[4])
return 1
