-- READ_EXTEND (after node_now.lua): a reader's extend. (A writer extends with extend.lua on
-- the writer key.)
--
-- KEYS[1]  the readers: reader tokens scored by their expiry, in ms on this node's clock
-- ARGV[1]  the reader's token
-- ARGV[2]  the new TTL in ms
--
-- Returns 1 when the reader was there and live and got the new expiry, 0 otherwise.
local now = node_now()
local s = redis.call('zscore', KEYS[1], ARGV[1])
-- An expired reader that is not pruned yet is gone all the same, as an expired PX key is: it
-- is never brought back, since a writer may already have pruned it and gone in.
if not s or tonumber(s) <= now then return 0 end
local ttl = tonumber(ARGV[2])
-- XX: only update, never add.
redis.call('zadd', KEYS[1], 'XX', now + ttl, ARGV[1])
if redis.call('pttl', KEYS[1]) < ttl then redis.call('pexpire', KEYS[1], ttl) end
return 1
