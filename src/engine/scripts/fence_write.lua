-- FENCE_WRITE: the write-back phase of a fenced lock (see fencing.rs). When the granting nodes
-- returned different counters, the largest must be on a quorum before it is handed out, or a
-- later grant's quorum might never see it and hand out a smaller token.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock key's fence counter
-- ARGV[1]  the holder's token
-- ARGV[2]  the fencing token to write back
--
-- Returns 1 when the key still held the token (the counter is now at least ARGV[2]); 0 when it
-- did not, with nothing changed.
-- Only while this node still holds our lock: the token is handed out only when a quorum
-- acknowledged while holding it (see fencing.rs). `pcall`: a key of another type (the hash of
-- a Redis 8 node's readers at a read-write lock's writer key) is not ours either.
if redis.pcall('get', KEYS[1]) ~= ARGV[1] then return 0 end
local f = redis.call('get', KEYS[2])
local n = 0
if f then
  n = tonumber(f)
  if not n then
    return redis.error_reply('ERR fence counter is not a whole number')
  end
end
-- Only ever raised: compare-and-set-if-greater.
if tonumber(ARGV[2]) > n then redis.call('set', KEYS[2], ARGV[2]) end
return 1
