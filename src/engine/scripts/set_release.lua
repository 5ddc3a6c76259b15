-- SET_RELEASE: removes a member from one of a read-write lock's sorted sets: a reader's token
-- from the readers (reader release), or a writer's id from the intents (intent withdrawal).
--
-- KEYS[1]  the sorted set
-- ARGV[1]  the member
-- ARGV[2]  the resource's wake channel
--
-- Returns 1 when the member was there (and the removal was announced), 0 when it was not.
if redis.call('zrem', KEYS[1], ARGV[1]) == 1 then
  -- Best effort, as in release.lua.
  redis.pcall('publish', ARGV[2], string.sub(ARGV[1], 1, 16))
  return 1
else
  return 0
end
