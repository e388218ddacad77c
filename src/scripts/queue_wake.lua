-- A release's part of the queue of waiting processes (queue_lib.lua, which
-- comes first): prepended to the scripts that wake a queued process
-- (release_plain.lua, leave.lua) and to no other, since a function defined
-- in a script is made and collected on every call of the script.

-- Wakes one queued process: the first whose entry has not run out and that
-- still listens (a process that died has no subscriber), removing every
-- entry it passes; if none, publishes '0' on the lock's channel (every
-- waiter, Redisson's included, wakes). Classic PUBLISH counts pattern
-- subscribers too (a monitoring tool's psubscribe *), so its channel's own
-- subscribers are counted first; sharded pub/sub has no patterns. What the
-- caller's ACL forbids (the queue, the wake-up channels: another process
-- with another user may have queued) ends the search there, never the
-- script.
-- (The clock is read here, not by a function of its own: a function defined
-- in a script is made and collected on every call of the script, and one
-- used by another costs an upvalue too.)
local function wake_queued(queue, channel, publish)
    -- Redis's clock in ms; none where the ACL forbids TIME.
    local t = redis.pcall('time')
    local now
    if type(t) == 'table' and not t.err then
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    while now do
        local e = redis.pcall('zpopmin', queue)
        if type(e) ~= 'table' or e.err or #e == 0 then
            break
        end
        if tonumber(e[2]) >= now then
            local listening
            if publish == 'publish' then
                local s = redis.pcall('pubsub', 'numsub', e[1])
                if type(s) == 'table' and not s.err then
                    listening = tonumber(s[2])
                end
            end
            if listening ~= 0 then
                local n = redis.pcall(publish, e[1], '0')
                if type(n) ~= 'number' then
                    break
                end
                if (listening or n) > 0 then
                    return
                end
            end
        end
    end
    redis.call(publish, channel, '0')
end

