-- The fair lock's part of release.lua (prepended to it, after fair_lib.lua):
-- KEYS[4] is the line, KEYS[5] the places and KEYS[6] the deadlines, the
-- unsettled keys start at KEYS[7], and a full release tells only the first
-- waiter in line.
local FIRST_UNSETTLED = 7
local LAST_UNSETTLED = #KEYS
-- A fair lock's release never hands it over (the line decides who is next).
local GRANT_TOKEN
local grant_allowed
-- (release.lua's other wake-ups, through the queue of waiting processes,
-- are not the fair lock's: its line is.)
local wake_queued
local function wake_waiters()
    wake_first(KEYS[4], KEYS[5], KEYS[6], KEYS[2], ARGV[6])
end

