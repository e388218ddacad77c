-- Release the last hold of a reentrant lock (Redisson RLock layout, fenced
-- or not) without an unlock latch: the usual release, sent when it hands
-- the lock to no waiting thread, the owner has no unsettled request on the
-- lock's slot, and it knows the generation its hold carries (release.lua
-- is the release with a latch, for every other case).
-- KEYS[1] lock hash   KEYS[2] release channel   KEYS[3] the lock's queue of
--         waiting processes (queue_lib.lua)
-- ARGV[1] owner field   ARGV[2] the generation the owner's hold carries
-- ARGV[3] the publish command: 'spublish' on a Cluster that has sharded
--         pub/sub, else none ('publish'; see release.lua)
-- It releases only a hold of that generation: a copy of it that reaches
-- Redis late finds the field gone, or a later hold of the same owner
-- carrying a newer generation (every acquisition writes one), and does
-- nothing. The generation field is written and removed with the owner
-- field, so its absence means the hold is gone. Nothing is left to tell a
-- copy sent again after a try failed on its connection whether that try
-- ran: finding the hold gone then, the client reports the try's failure.
-- A release whose reply was lost is completed with release.lua.
-- Returns nil when the owner's hold is gone, 3 when it carries another
-- generation (nothing done: the client releases it with release.lua), 1
-- when the lock was deleted and its waiters told.
-- Five arguments fewer than release.lua (four with sharded pub/sub), and
-- two fields read instead of three: each argument and each field read costs Redis more than the Lua
-- that would use it.
local publish = ARGV[3] or 'publish'
local state = redis.call('hmget', KEYS[1], ARGV[1] .. ':gen', QUEUED)
if state[1] ~= ARGV[2] then
    if state[1] then
        return 3
    end
    return nil
end
-- Publish before deleting, as release.lua: a user whose ACL lacks the
-- channel stops the script here with nothing changed.
if state[2] then
    wake_queued(KEYS[3], KEYS[2], publish)
else
    redis.call(publish, KEYS[2], '0')
end
redis.call('del', KEYS[1])
return 1
