-- DOWNGRADE (after node_now.lua): the writer of a read-write lock becomes one of its readers,
-- in one atomic step on this node, so that the resource is never free here in between.
--
-- KEYS[1]  the writer key
-- KEYS[2]  the readers: reader tokens scored by their expiry, in ms on this node's clock
-- ARGV[1]  the writer's token, which becomes the reader's token
-- ARGV[2]  the reader's TTL in ms
-- ARGV[3]  the resource's wake channel
--
-- Returns 1 when the writer key held the token and the reader took its place, 0 when it did not
-- (it expired, or was never set on this node): then nothing changed.
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[2])
-- While our writer key is here, no reader is live here: a writer only goes in where every
-- reader has expired, and no reader goes in beside a writer. So the reader set holds expired
-- entries at most, and is replaced by one with our reader alone (scored by its expiry on this
-- node's clock, as read_acquire.lua scores every reader, with the set's TTL the reader's).
-- The writer key goes in the same DEL: the script is atomic, so no other command sees the node
-- between the reader going in and the writer key going out, whatever their order here.
redis.call('del', KEYS[1], KEYS[2])
redis.call('zadd', KEYS[2], node_now() + ttl, ARGV[1])
redis.call('pexpire', KEYS[2], ttl)
-- Waiting readers may join now. A waiting writer woken by this only finds our reader in place
-- and is refused. Best effort, as in release.lua.
redis.pcall('publish', ARGV[3], string.sub(ARGV[1], 1, 16))
return 1
