-- FENCED_ACQUIRE: a mutex acquire (SET NX PX) that, when it takes the key, raises this node's
-- fence counter by one and returns it, in the same atomic step. This is the read phase of a
-- fenced lock (see fencing.rs): the client's token is the largest counter a quorum granted.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock key's fence counter (see keys.rs), with no expiry
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
--
-- Returns the raised counter (1 or more) when the key was taken, -1 when it was held, and an
-- error when the counter is unusable.
local f = redis.call('get', KEYS[2])
local n = 0
-- Check the counter before anything is set, so that an error leaves the lock untouched.
if f then
  n = tonumber(f)
  if not n or n < 0 or n ~= math.floor(n) then
    return redis.error_reply('ERR fence counter is not a whole number')
  end
end
-- 2^53 - 1: Lua's numbers hold integers exactly only up to here.
if n >= 9007199254740991 then return redis.error_reply('ERR fence counter exhausted') end
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return -1 end
n = n + 1
-- '%d', not tostring: large numbers would be written in exponent form.
redis.call('set', KEYS[2], string.format('%d', n))
return n
