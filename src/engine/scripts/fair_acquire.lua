-- A mutex acquire (SET NX PX): the body of FAIR_ACQUIRE (after node_now.lua, the prelude
-- `local kind, readers_share = '', false` and fair_gate.lua), where only the queue's head may
-- win, and of the fenced mutex's `attempt()` (see fence_check.lua), after no_queue.lua or the
-- same gate.
--
-- KEYS[1]  the lock key
-- KEYS[2]  (fenced only) the fence counter, read by fence_check.lua
-- KEYS[#KEYS - 1], KEYS[#KEYS]  (fair only) the mutex's fair queue and its expiries, read by
--          the gate
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
-- ARGV[3..6]  (fair only) waiter id, ticket, entry TTL in ms, join: read by the gate
--
-- Answers 1 when the lock was taken (and a fair waiter left the queue), 0 when it was refused
-- without queueing, 2 + rank when it was refused and the waiter is (still) queued behind
-- `rank` others (see fair_gate.lua).
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return won() end
return refused()
