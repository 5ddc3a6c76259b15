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
-- The writer key goes and our reader comes in one atomic step: no other command sees the node
-- in between, whatever their order here. Our reader joins the set beside any other entry, as
-- read_acquire.lua adds readers: the set is not replaced. A node may hold a live reader beside
-- our writer key for a moment (a Redis 8 writer's SET NX goes in before its EXISTS on the set
-- finds a reader there, and its key comes out only with the cleanup of that refused vote), and
-- dropping that reader's entry would free the node under it. The set lives at least as long
-- as its longest-lived reader (scored by its expiry on this node's clock).
redis.call('del', KEYS[1])
redis.call('zadd', KEYS[2], node_now() + ttl, ARGV[1])
if redis.call('pttl', KEYS[2]) < ttl then redis.call('pexpire', KEYS[2], ttl) end
-- Waiting readers may join now. A waiting writer woken by this only finds our reader in place
-- and is refused. Best effort, as in release.lua.
redis.pcall('publish', ARGV[3], string.sub(ARGV[1], 1, 16))
return 1
