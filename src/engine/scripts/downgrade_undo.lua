-- DOWNGRADE_UNDO: undoes a lost downgrade, on every node: removes the reader entry with the
-- token, and deletes the writer key where it still holds the token (a node the downgrade never
-- reached, or reached too late to count). Announced on the wake channel when either was there.
--
-- KEYS[1]  the writer key
-- KEYS[2]  the readers
-- ARGV[1]  the token (the writer's, and the reader's it was to become)
-- ARGV[2]  the resource's wake channel
--
-- Returns how many of the two entries it removed (0 or 1: a node holds one or the other).
local n = redis.call('zrem', KEYS[2], ARGV[1])
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  n = n + 1
end
if n > 0 then redis.pcall('publish', ARGV[2], string.sub(ARGV[1], 1, 16)) end
return n
