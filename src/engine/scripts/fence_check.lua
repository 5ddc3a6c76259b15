-- Fragment, first in every fenced acquire script (FENCED_ACQUIRE, FAIR_FENCED_ACQUIRE,
-- FENCED_WRITE_ACQUIRE, FAIR_FENCED_WRITE_ACQUIRE), after a one-line prelude that sets
-- `fence_key`, the KEYS entry of the lock key's fence counter (see keys.rs), which has no
-- expiry. The acquire itself is the function `attempt()`, defined after this; fence_grant.lua
-- calls it last. This is the read phase of a fenced lock (see fencing.rs): when the attempt
-- takes the lock, this node's counter is raised by one and returned in the same atomic step,
-- and the client's token is the largest counter a quorum granted.
--
-- The counter is read and checked before anything is set, so that an unusable one (not a
-- whole number, or at 2^53 - 1, where Lua's numbers stop holding integers exactly) is an
-- error that leaves the lock untouched.
local f = redis.call('get', fence_key)
local n = 0
if f then
  n = tonumber(f)
  if not n or n < 0 or n ~= math.floor(n) then
    return redis.error_reply('ERR fence counter is not a whole number')
  end
end
if n >= 9007199254740991 then return redis.error_reply('ERR fence counter exhausted') end
