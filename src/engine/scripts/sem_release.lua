-- SEM_RELEASE (after node_now.lua): a semaphore holder gives its slot back, as a release or
-- as the cleanup of a lost attempt.
--
-- KEYS[1]  the holders, as in sem_acquire.lua
-- ARGV[1]  the holder's token
-- ARGV[2]  the resource's wake channel
--
-- Returns 1 when the token was there (and the release was announced), 0 when it was not.
if redis.call('zrem', KEYS[1], ARGV[1]) == 1 then
  -- The last live holder takes the set, marker and all, so that a semaphore nobody holds
  -- leaves no key behind.
  if redis.call('zcount', KEYS[1], '(' .. node_now(), '+inf') == 0 then
    redis.call('del', KEYS[1])
  end
  -- Best effort, as in release.lua.
  redis.pcall('publish', ARGV[2], string.sub(ARGV[1], 1, 16))
  return 1
end
return 0
