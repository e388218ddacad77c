-- The reentrant lock's part of release.lua (prepended to it, after
-- queue_lib.lua and queue_wake.lua): KEYS[4] is the lock's queue of waiting processes, the
-- unsettled keys start at KEYS[5]; a full release wakes one queued process
-- when the hash says some are queued, else it publishes '0' on the lock's
-- channel (one waiter per process wakes).
-- A full release may hand the lock to a waiting thread of the releasing
-- client instead (engine/grants.rs), given:
-- ARGV[8] the waiter's owner field   ARGV[9] its generation (request id)
-- ARGV[10] its lease in ms
-- ARGV[11] if it was its process's last waiter: its process's entry in the
--          queue, which leaves it (as acquire.lua's 'l'); else ''
-- ARGV[12] 'f' for a fenced lock: the key before the last is its token key
--          (acquire.lua's KEYS[3]), incremented for the waiter
-- and, as the last key, the waiter's cancel marker.
local FIRST_UNSETTLED = 5
local LAST_UNSETTLED = #KEYS
-- A fenced lock's token key, when the lock may be handed over.
local GRANT_TOKEN
if ARGV[8] then
    LAST_UNSETTLED = #KEYS - 1
    if ARGV[12] == 'f' then
        GRANT_TOKEN = KEYS[#KEYS - 1]
        LAST_UNSETTLED = #KEYS - 2
    end
end

-- Whether the lock may go straight to the waiter named in ARGV[8]: it has
-- not given up (its cancel marker is absent), holds nothing of it, and
-- nobody else listens for the lock's release (one subscriber: this
-- client's): a waiter of another process, queued or not, Redisson's too,
-- is woken as always. Where the ACL forbids counting, no hand-off. Made
-- only when a waiter is named (a function defined in a script is made and
-- collected on every call): nil, no hand-off, when none is.
local grant_allowed
if ARGV[8] then
    grant_allowed = function()
        if redis.call('exists', KEYS[#KEYS]) == 1 or redis.call('hexists', KEYS[1], ARGV[8]) == 1 then
            return false
        end
        local counted
        if ARGV[6] == 'publish' then
            counted = redis.pcall('pubsub', 'numsub', KEYS[2])
        else
            counted = redis.pcall('pubsub', 'shardnumsub', KEYS[2])
        end
        if type(counted) ~= 'table' or counted.err then
            return false
        end
        return tonumber(counted[2]) <= 1
    end
end
-- A full release wakes one queued process when the hash says some are
-- queued (wake_queued, queue_wake.lua), else every waiter (release.lua):
-- no function of this part's own, since a function defined in a script is
-- made and collected on every call.
local wake_waiters

