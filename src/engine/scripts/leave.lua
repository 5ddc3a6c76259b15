-- LEAVE: a waiter leaves a fair queue, whether it won, gave up or failed. Sent to every node
-- when a fair acquisition is over: a node that answered after the round was decided may hold
-- an entry the client never saw, which would keep this waiter the head there until it expires.
--
-- KEYS[1]  the lock key (a mutex key, or a read-write lock's writer key)
-- KEYS[2]  the queue
-- KEYS[3]  the queue's expiries
-- ARGV[1]  the queue entry: the waiter's kind ('', 'r' or 'w') followed by its id
-- ARGV[2]  the resource's wake channel
--
-- Returns 1 when the entry was there, 0 when it was not.
local gone = redis.call('zrem', KEYS[2], ARGV[1])
redis.call('zrem', KEYS[3], ARGV[1])
-- The next waiter may be the head now. If the lock is free it can take it at once, so tell
-- it rather than let it sleep until its next retry (best effort, as in release.lua).
if gone == 1 and redis.call('exists', KEYS[1]) == 0 then
  redis.pcall('publish', ARGV[2], string.sub(ARGV[1], 1, 16))
end
return gone
