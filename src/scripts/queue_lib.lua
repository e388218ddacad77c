-- The queue of waiting processes of a reentrant lock (redlease's own):
-- a sorted set redlease_waiting:{<tag>}:<name> of wake-up channels
-- (redlease_wake:{<tag>}:<name>:<client-uuid>, one per process that waits
-- for the lock; <tag> puts them in the lock's slot), each scored with the
-- time (ms, Redis's clock) after which it counts as gone. A release that
-- finds the field QUEUED in the lock hash hands the wake-up to one queued
-- process instead of publishing on the lock's channel, which every waiting
-- process (and Redisson) listens on: one process wakes, not all of them.
local QUEUED = 'redlease:waiting'
