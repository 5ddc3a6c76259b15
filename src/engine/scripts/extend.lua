-- EXTEND: compare-and-PEXPIRE of a lock key. Used by the mutex, the fenced mutex and the
-- writer of a read-write lock.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the holder's token
-- ARGV[2]  the new TTL in ms
--
-- Returns 1 when the key still held the token and got the new TTL, 0 otherwise (a key that
-- expired is never brought back).
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
else
  return 0
end
