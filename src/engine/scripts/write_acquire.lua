-- The body of WRITE_ACQUIRE (after node_now.lua and no_queue.lua) and of FAIR_WRITE_ACQUIRE
-- (after node_now.lua, the prelude `local kind, readers_share = 'w', false` and
-- fair_gate.lua): a writer takes a read-write lock. The fenced write lock's `attempt()` (see
-- fence_check.lua) is the same, after no_queue.lua or the same gate.
--
-- KEYS[1]  the writer key: the writer's token, with a PX expiry
-- KEYS[2]  the readers: reader tokens scored by their expiry, in ms on this node's clock
-- KEYS[3]  the intents: waiting writers' ids scored by their expiry, in ms on this node's clock
-- KEYS[4]  (fenced only) the writer key's fence counter, read by fence_check.lua
-- KEYS[#KEYS - 1], KEYS[#KEYS]  (fair only) the queue and its expiries, read by the gate
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
-- ARGV[3]  intent ms: how long a refused writer's intent lives; 0 for the read-preferring
--          policy, which leaves no intent
-- ARGV[4]  the waiter id, which names this writer's intent
-- ARGV[5..7]  (fair only) ticket, entry TTL, join, read by the gate
--
-- Returns 1 when the writer key was taken, 0 when refused, and (fair only) 2 when refused
-- with the writer queued.
local now
local free = redis.call('exists', KEYS[1], KEYS[2]) == 0
-- Readers but no writer: the readers may all have expired. A reader set only disappears once
-- its longest-lived member expired, so prune the expired ones before deciding.
if not free and redis.call('exists', KEYS[1]) == 0 then
  now = node_now()
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
  free = redis.call('exists', KEYS[2]) == 0
end
local intent = tonumber(ARGV[3])
if free then
  redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
  -- This writer waited with an intent: it is in, so the intent no longer holds readers back.
  if intent > 0 then redis.call('zrem', KEYS[3], ARGV[4]) end
  return won()
end
-- Write-preferring: leave (or refresh) this writer's intent, so new readers are refused here
-- while the readers in place drain. Prune expired intents, and keep the set's TTL at least as
-- long as its longest-lived member, so an abandoned set disappears on its own.
if intent > 0 then
  if not now then now = node_now() end
  redis.call('zremrangebyscore', KEYS[3], '-inf', now)
  redis.call('zadd', KEYS[3], now + intent, ARGV[4])
  if redis.call('pttl', KEYS[3]) < intent then redis.call('pexpire', KEYS[3], intent) end
end
return refused()
