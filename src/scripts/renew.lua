-- Renew many leases in one call (the watchdog's batch), of every kind.
-- ARGV[1] flags, as a number: 1 to read the owner fields with pcall (the
--         batch run again after one of its keys turned out not to be a
--         hash); 2 to extend with PEXPIRE, not reading the clock (the
--         client was told to, see below)
-- ARGV[2..] sections, one after another, each:
--   lease in ms, n (locks in it), mode, owner:
--   mode 'f' (one field): owner = the owner field of all n locks;
--            per lock: the generation the owner last wrote
--   mode 'e' (each its own field): owner = the owner prefix '<client-uuid>:';
--            per lock: the rest of its owner field, its generation
--   mode 'r' (read holds): as 'e', then per lock the hold keys' prefix (see
--            rw_lib.lua)
--   modes 'F', 'E': as 'f', 'e', for locks whose keys can carry no longer
--            lease than this one (the client knows what each generation
--            set): extended without GT
-- KEYS: the locks, in the order of the sections.
-- A generation is compared as written ('g<id>' for the read-write lock).
-- A renewal never shortens a lease (GT; on a server older than 7.0, which
-- refuses GT, PTTL first; modes 'F' and 'E' need neither). A lease is set as
-- Redis's clock at the start of the call plus the lease (PEXPIREAT, the clock
-- read with TIME once per call): less work for Redis per lock than PEXPIRE,
-- which it rewrites to PEXPIREAT with a new argument on every call. Where
-- that cannot be (the ACL forbids TIME or PEXPIREAT, the server refuses GT),
-- PEXPIRE, and the reply tells the client to ask for PEXPIRE from then on, so
-- that a refused command is tried once, not on every call (a refusal is
-- counted in the server's error stats and ACL LOG). A lease is extended only
-- while the owner's generation field (<owner>:gen, written and removed with
-- the owner field) carries that generation: a lock that was released, expired
-- or taken over is never brought back, and a renewal taken for an earlier
-- state of a hold (sent before a re-entry, a partial release, or a release
-- and a new acquisition by the same owner) cannot extend the lease that state
-- set. A read hold renews its own hold keys (never other readers', so a dead
-- reader's hold ends), is gone once one of them has expired, and never
-- shortens the hash's lease (other readers may need longer). A key that is no
-- longer a hash (overwritten by someone else) fails the call with WRONGTYPE:
-- the caller runs the batch again with flag 1, where it counts as gone for
-- that lock alone.
-- Returns a flat array of pairs for the locks not renewed, usually empty:
-- (1-based position, 0) when the lock is gone (the holder has lost it), or
-- (position, "<generation found>") when the generation differs (stale);
-- and the pair (0, 'pexpire') when PEXPIREAT could not be used here.
-- As locals: a global is looked up by its name at every use, and the
-- loops below run once per lock.
local KEYS, ARGV, call = KEYS, ARGV, redis.call
local flags = tonumber(ARGV[1])
local read = call
if flags % 2 == 1 then
    read = redis.pcall
end
-- Redis's clock in ms; nil when asked not to read it, or where the ACL
-- forbids TIME.
local now
-- Told to the client, once PEXPIREAT was found unusable.
local relative = false
if flags < 2 then
    -- A server that replicates scripts verbatim (older than 5.0, or set
    -- so) allows no write after TIME, unless told to replicate effects.
    if redis.replicate_commands then
        pcall(redis.replicate_commands)
    end
    local t = redis.pcall('time')
    if type(t) == 'table' and not t.err then
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    else
        relative = true
    end
end
-- How a section's locks are extended: the command and its time argument
-- (PEXPIRE for a lease that would end past 2^53 ms, which a Lua number no
-- longer holds exactly).
local function extension(lease)
    if now and now + tonumber(lease) < 9007199254740992 then
        return 'pexpireat', string.format('%.0f', now + tonumber(lease))
    end
    return 'pexpire', lease
end
-- Whether the expire commands take GT here (Redis 7 and later): unknown
-- until the first lock is extended, which finds out.
local gt
-- The command known to be allowed here, once a lock was extended with it.
local allowed
-- Extends a lock's lease without GT, finding out first, if not known yet,
-- whether PEXPIREAT is allowed (PEXPIRE from then on where it is not).
-- Returns the command and time argument to go on with.
local function extend_plain(key, lease, cmd, when)
    if cmd == 'pexpireat' then
        if type(redis.pcall(cmd, key, when)) == 'number' then
            allowed = cmd
            return cmd, when
        end
        now = nil
        relative = true
        cmd, when = 'pexpire', lease
    end
    redis.call(cmd, key, when)
    allowed = cmd
    return cmd, when
end
-- Extends a lock's lease while GT is not known to work: the first lock
-- finds out (with PEXPIREAT refused by the ACL, PEXPIRE from then on);
-- without GT, the TTL is read first. Returns the command and time argument
-- to go on with.
local function extend_slow(key, lease, cmd, when)
    if gt == nil then
        if type(redis.pcall(cmd, key, when, 'gt')) == 'number' then
            gt = true
            allowed = cmd
            return cmd, when
        end
        if cmd == 'pexpireat' then
            now = nil
            relative = true
            cmd, when = 'pexpire', lease
            if type(redis.pcall(cmd, key, when, 'gt')) == 'number' then
                gt = true
                allowed = cmd
                return cmd, when
            end
        end
        gt = false
    end
    redis.call('pexpire', key, math.max(redis.call('pttl', key), tonumber(lease)))
    return cmd, when
end
local out = {}
local a = 2
local i = 0
while a <= #ARGV do
    local lease, n, mode, owner = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
    a = a + 4
    local cmd, when = extension(lease)
    -- Upper case: without GT.
    local plain = mode == 'F' or mode == 'E'
    if mode ~= 'r' then
        -- 'e', 'E': each lock's own field, its rest before its generation.
        local each = mode == 'e' or mode == 'E'
        local field = owner .. ':gen'
        local last = i + n
        -- One lock at a time while the command to extend with is not known
        -- to work here (the first lock extended finds out), or GT is known
        -- not to.
        while i < last and not (plain and cmd == allowed or not plain and gt) do
            i = i + 1
            local key = KEYS[i]
            if each then
                field = owner .. ARGV[a] .. ':gen'
                a = a + 1
            end
            local gen = read('hget', key, field)
            if gen == ARGV[a] then
                if plain then
                    cmd, when = extend_plain(key, lease, cmd, when)
                else
                    cmd, when = extend_slow(key, lease, cmd, when)
                end
            else
                out[#out + 1] = i
                out[#out + 1] = type(gen) == 'string' and gen or 0
            end
            a = a + 1
        end
        -- The rest with as little Lua per lock as can be: the loops below
        -- are where Redis spends a renewal's script time beside its two
        -- calls (one loop per mode, no test of the mode inside).
        if i < last then
            if each then
                if plain then
                    for k = i + 1, last do
                        local key = KEYS[k]
                        local gen = read('hget', key, owner .. ARGV[a] .. ':gen')
                        if gen == ARGV[a + 1] then
                            call(cmd, key, when)
                        else
                            out[#out + 1] = k
                            out[#out + 1] = type(gen) == 'string' and gen or 0
                        end
                        a = a + 2
                    end
                else
                    for k = i + 1, last do
                        local key = KEYS[k]
                        local gen = read('hget', key, owner .. ARGV[a] .. ':gen')
                        if gen == ARGV[a + 1] then
                            call(cmd, key, when, 'gt')
                        else
                            out[#out + 1] = k
                            out[#out + 1] = type(gen) == 'string' and gen or 0
                        end
                        a = a + 2
                    end
                end
            else
                -- Lock k's generation is ARGV[k + d].
                local d = a - i - 1
                if plain then
                    for k = i + 1, last do
                        local key = KEYS[k]
                        local gen = read('hget', key, field)
                        if gen == ARGV[k + d] then
                            call(cmd, key, when)
                        else
                            out[#out + 1] = k
                            out[#out + 1] = type(gen) == 'string' and gen or 0
                        end
                    end
                else
                    for k = i + 1, last do
                        local key = KEYS[k]
                        local gen = read('hget', key, field)
                        if gen == ARGV[k + d] then
                            call(cmd, key, when, 'gt')
                        else
                            out[#out + 1] = k
                            out[#out + 1] = type(gen) == 'string' and gen or 0
                        end
                    end
                end
                a = a + last - i
            end
            i = last
        end
    else
        for _ = 1, n do
            i = i + 1
            local key = KEYS[i]
            local field = owner .. ARGV[a]
            local v = read('hmget', key, field, field .. ':gen')
            if type(v) ~= 'table' or v.err or not v[2] then
                out[#out + 1] = i
                out[#out + 1] = 0
            elseif v[2] ~= ARGV[a + 1] then
                out[#out + 1] = i
                out[#out + 1] = v[2]
            else
                -- A read hold whose key has expired has lost its lease
                -- (Redisson's readers count it dead): gone.
                local ms = tonumber(lease)
                local alive = true
                for k = 1, tonumber(v[1]) or 0 do
                    local hold = ARGV[a + 2] .. ':' .. k
                    local ttl = redis.call('pttl', hold)
                    if ttl == -2 then
                        alive = false
                    else
                        redis.call('pexpire', hold, math.max(ttl, ms))
                    end
                end
                if alive then
                    redis.call('pexpire', key, math.max(redis.call('pttl', key), ms))
                else
                    out[#out + 1] = i
                    out[#out + 1] = 0
                end
            end
            a = a + 3
        end
    end
end
if relative then
    out[#out + 1] = 0
    out[#out + 1] = 'pexpire'
end
return out
