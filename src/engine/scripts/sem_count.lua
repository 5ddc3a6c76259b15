-- SEM_COUNT (after node_now.lua): how many live holders a semaphore has on this node. Read
-- only.
--
-- KEYS[1]  the holders, as in sem_acquire.lua
--
-- Returns the number of holders whose expiry is after this node's clock.
return redis.call('zcount', KEYS[1], '(' .. node_now(), '+inf')
