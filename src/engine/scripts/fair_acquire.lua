-- FAIR_ACQUIRE, after node_now.lua, the prelude `local kind, readers_share = '', false` and
-- fair_gate.lua: a mutex acquire (SET NX PX) that only the queue's head may win.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the mutex's fair queue
-- KEYS[3]  the queue's expiries
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
-- ARGV[3]  the waiter id
-- ARGV[4]  the ticket
-- ARGV[5]  the entry TTL in ms
-- ARGV[6]  join: '1' to join even an empty queue
--
-- Returns 1 when the lock was taken (and the waiter left the queue), 0 when it was refused
-- without queueing, 2 when it was refused and the waiter is (still) queued.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return won() end
return refused()
