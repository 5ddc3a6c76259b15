-- WRITE_CLEANUP (after node_now.lua): cleanup after a lost write attempt, on every node.
--
-- KEYS[1]  the writer key
-- KEYS[2]  the intents
-- ARGV[1]  the lost attempt's token
-- ARGV[2]  the resource's wake channel
-- ARGV[3]  intent ms (0 when the writer gave up, or for the read-preferring policy)
-- ARGV[4]  the waiter id, which names the writer's intent
--
-- Returns 1.
-- Compare-and-delete of the writer key, announced when it deleted (as in release.lua).
-- `pcall`: a key of another type (the hash of a Redis 8 node's readers) is not ours, and the
-- intent below is refreshed all the same.
local took = redis.pcall('get', KEYS[1]) == ARGV[1]
if took then
  redis.call('del', KEYS[1])
  redis.pcall('publish', ARGV[2], string.sub(ARGV[1], 1, 16))
end
-- A writer that goes on waiting leaves its intent here too where the write went through but
-- the quorum did not, so that this node still holds new readers back, and refreshes the one
-- its refused attempts left. Nowhere else: a cleanup may run late, sent again on a new
-- connection after the writer withdrew its intent, or on a node its attempt never reached,
-- and an intent it added there would keep readers out with no writer waiting.
local intent = tonumber(ARGV[3])
if intent > 0 and (took or redis.call('zscore', KEYS[2], ARGV[4])) then
  local now = node_now()
  redis.call('zadd', KEYS[2], now + intent, ARGV[4])
  if redis.call('pttl', KEYS[2]) < intent then redis.call('pexpire', KEYS[2], intent) end
end
return 1
