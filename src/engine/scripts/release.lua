-- RELEASE: compare-and-delete of a lock key, announced on the resource's wake channel.
-- Used by the mutex, the fenced mutex, the writer of a read-write lock (on a server without
-- DELEX) and the cleanup of a lost mutex attempt.
--
-- KEYS[1]  the lock key (a mutex key, or a read-write lock's writer key)
-- ARGV[1]  the holder's token
-- ARGV[2]  the resource's wake channel (see keys.rs)
--
-- Returns 1 when the key held the token and was deleted; 0 when it did not (it expired, was
-- never set on this node, or holds another holder's token), which the client also counts as
-- an acknowledgement.
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  -- Waiters retry as soon as they hear this. The message is the token's first 16 characters:
  -- 64 bits that name the release without giving the token away. `pcall`, because the
  -- announcement is best effort: an ACL user without channel permissions (Redis 7's default
  -- for new users) must still be able to release, and the key is already deleted.
  redis.pcall('publish', ARGV[2], string.sub(ARGV[1], 1, 16))
  return 1
else
  return 0
end
