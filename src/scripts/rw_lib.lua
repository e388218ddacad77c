-- Shared by the read-write lock's scripts (prepended to each of them).
-- Redisson's RReadWriteLock layout: the hash <name> has 'mode' = 'read' or
-- 'write', reader fields <uuid>:<thread> and writer fields
-- <uuid>:<thread>:write whose values are hold counts; each read hold k
-- (1..count) also has a key <prefix>:<k> ('1' with the hold's lease; prefix
-- = {<name>}:<uuid>:<thread>:rwlock_timeout), which Redisson's read unlock
-- reads to find the readers still alive. redlease adds each owner's
-- generation at <field>:gen, written as 'g<id>': never a number, since
-- Redisson's read unlock takes every numeric field for a reader's count.

-- The longest remaining lease of the read holds of every reader but `skip`
-- (-3 if none lives); `base` is {<name>} (or <name> when it has a tag).
local function readers_ttl(name, base, skip)
    local longest = -3
    local fields = redis.call('hgetall', name)
    for i = 1, #fields, 2 do
        local count = tonumber(fields[i + 1])
        if count and fields[i] ~= skip then
            for k = count, 1, -1 do
                local key = base .. ':' .. fields[i] .. ':rwlock_timeout:' .. k
                longest = math.max(longest, redis.call('pttl', key))
            end
        end
    end
    return longest
end

-- Leaves `left` (> 0) of the `held` holds of `field`, with generation `gen`,
-- each living at least `lease` more. A reader's released hold keys go and
-- the others are extended (never shortened); false, with nothing changed,
-- if one of them has expired already (that hold is gone: Redisson's readers
-- would count it dead). A writer's lease never cuts short its own thread's
-- read holds (the only ones a write-mode hash has).
local function keep_holds(name, field, held, left, gen, lease, prefix, base)
    lease = tonumber(lease)
    if prefix ~= '' then
        for k = 1, left do
            if redis.call('exists', prefix .. ':' .. k) == 0 then
                return false
            end
        end
    end
    redis.call('hset', name, field, left, field .. ':gen', 'g' .. gen)
    if prefix == '' then
        redis.call('pexpire', name, math.max(lease, readers_ttl(name, base, nil)))
        return true
    end
    for k = left + 1, held do
        redis.call('del', prefix .. ':' .. k)
    end
    for k = 1, left do
        local key = prefix .. ':' .. k
        redis.call('pexpire', key, math.max(redis.call('pttl', key), lease))
    end
    redis.call('pexpire', name, math.max(redis.call('pttl', name), lease))
    return true
end

-- Removes every hold of `field` (a writer when `prefix` is '') and what kept
-- them. Then: nothing else held -> the hash goes and waiters are told ('1',
-- wake all, for a writer; '0' for a reader, as Redisson); a writer whose
-- thread still reads -> mode 'read' (a downgrade; the hash goes if those
-- read holds' keys have all expired) and every waiter is told ('1': readers
-- may enter; Redisson publishes nothing here); readers left ->
-- the hash lives as long as the longest live read hold, and goes (waking a
-- waiter) if none lives: the remaining readers are dead holders. The
-- message goes out before any change, so a user whose ACL lacks the channel
-- stops the script with nothing changed.
local function drop_holds(name, channel, field, held, prefix, base, publish)
    local has_gen = redis.call('hexists', name, field .. ':gen')
    local others = redis.call('hlen', name) - 2 - has_gen
    local mode = redis.call('hget', name, 'mode')
    local writer = prefix == ''
    local ttl = -3
    if others <= 0 then
        redis.call(publish, channel, writer and 1 or 0)
        redis.call('del', name)
    elseif writer and mode == 'write' then
        redis.call(publish, channel, '1')
        ttl = readers_ttl(name, base, field)
        if ttl > 0 then
            redis.call('hdel', name, field, field .. ':gen')
            redis.call('hset', name, 'mode', 'read')
            redis.call('pexpire', name, ttl)
        else
            -- The thread's read holds are gone too (their keys expired).
            redis.call('del', name)
        end
    elseif mode == 'read' then
        ttl = readers_ttl(name, base, field)
        if ttl <= 0 then
            redis.call(publish, channel, '0')
            redis.call('del', name)
        else
            redis.call('hdel', name, field, field .. ':gen')
            redis.call('pexpire', name, ttl)
        end
    else
        -- The writer's own read hold: the write hold keeps the hash.
        redis.call('hdel', name, field, field .. ':gen')
    end
    if not writer then
        for k = 1, held do
            redis.call('del', prefix .. ':' .. k)
        end
    end
end

