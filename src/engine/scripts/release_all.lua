-- RELEASE_ALL: compare-and-delete of every key of an all-or-none set that still holds its
-- token.
--
-- KEYS        the set's keys
-- ARGV[1]     the holder's token
-- ARGV[i + 1] the wake channel of KEYS[i]
--
-- Returns how many keys were deleted. Fewer than the set's only means some had expired, were
-- never set on this node, or now hold something else; the client counts any number as an
-- acknowledgement.
local n = 0
for i = 1, #KEYS do
  -- `pcall`: a key someone else turned into another type (a hash, a list) makes GET fail with
  -- WRONGTYPE, and with `call` that error would abort the script half-way, leaving the keys
  -- after it held until their TTL. Such a key is not ours: leave it alone and go on.
  if redis.pcall('get', KEYS[i]) == ARGV[1] then
    redis.call('del', KEYS[i])
    -- Each key's own waiters are told (best effort, as in release.lua).
    redis.pcall('publish', ARGV[i + 1], string.sub(ARGV[1], 1, 16))
    n = n + 1
  end
end
return n
