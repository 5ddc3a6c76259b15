-- Fragment, last in every fenced acquire script (see fence_check.lua): runs the acquire,
-- `attempt()`, which answers 1 when it took the lock and anything else (0, or 2 for a refusal
-- that left a fair waiter queued) when it did not.
--
-- Returns the raised counter (1 or more) when the lock was taken, -1 when it was refused.
-- A refusal is -1 whether or not the waiter is queued, so that no answer of the acquire can be
-- read as a counter.
if attempt() ~= 1 then return -1 end
n = n + 1
-- '%d', not tostring: large numbers would be written in exponent form.
redis.call('set', fence_key, string.format('%d', n))
return n
