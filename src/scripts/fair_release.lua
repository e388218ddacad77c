-- The fair lock's part of release.lua (prepended to it, after fair_lib.lua):
-- KEYS[4] is the line and KEYS[5] the places, the unsettled keys start at
-- KEYS[6], and a full release tells only the first waiter in line.
local FIRST_UNSETTLED = 6
local function wake_waiters()
    wake_first(KEYS[4], KEYS[5], KEYS[2], ARGV[6])
end

