-- EXTEND_ALL: compare-and-PEXPIRE of a whole all-or-none set.
--
-- KEYS     the set's keys
-- ARGV[1]  the holder's token
-- ARGV[2]  the new TTL in ms
--
-- Returns 1 when every key still held the token and got the new TTL; 0 otherwise, with
-- nothing changed.
-- Read every key before extending any. `pcall`: a key of another type is not ours, so it
-- refuses rather than fail with WRONGTYPE.
for i = 1, #KEYS do
  if redis.pcall('get', KEYS[i]) ~= ARGV[1] then return 0 end
end
for i = 1, #KEYS do
  redis.call('pexpire', KEYS[i], ARGV[2])
end
return 1
