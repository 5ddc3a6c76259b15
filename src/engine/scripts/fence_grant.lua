-- Fragment, last in every fenced acquire script (see fence_check.lua): runs the acquire,
-- `attempt()`, which answers 1 when it took the lock and anything else (0, or 2 + rank for a
-- refusal that left a fair waiter queued behind `rank` others, see fair_gate.lua) when it did
-- not.
--
-- Returns the raised counter (1 or more) when the lock was taken, and a negative number when
-- it was refused: -1 - rank for a fair waiter queued behind `rank` others, -1 for every other
-- refusal. No refusal can be read as a counter.
local taken = attempt()
if taken ~= 1 then
  if taken > 2 then return 1 - taken end
  return -1
end
n = n + 1
-- '%d', not tostring: large numbers would be written in exponent form.
redis.call('set', fence_key, string.format('%d', n))
return n
