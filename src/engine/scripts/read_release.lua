-- READ_RELEASE: a reader's release, and the cleanup of a lost read attempt: the reader's token
-- leaves both places a reader can be, the reader set and the hash at the writer key (where a
-- node with hash-field expiry keeps the readers that joined with `HSETEX`). A release may be
-- written before its node's server is known (one kept for a cluster master whose link was
-- never set up, such as the replica promoted in a failover), so this form, the one for a node
-- without `HSETEX`, addresses the hash too.
--
-- KEYS[1]  the reader set
-- KEYS[2]  the writer key
-- ARGV[1]  the reader's token
-- ARGV[2]  the resource's wake channel
--
-- Returns 1 when the token was in either place (and the removal was announced), 0 when not.
local gone = redis.call('zrem', KEYS[1], ARGV[1])
-- `pcall`: a writer's string at the writer key is not ours (`WRONGTYPE`).
local field = redis.pcall('hdel', KEYS[2], ARGV[1])
if type(field) == 'number' then
  gone = gone + field
end
if gone > 0 then
  -- Best effort, as in release.lua.
  redis.pcall('publish', ARGV[2], string.sub(ARGV[1], 1, 16))
  return 1
else
  return 0
end
