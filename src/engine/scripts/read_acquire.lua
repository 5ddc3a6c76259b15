-- The body of READ_ACQUIRE (after node_now.lua and no_queue.lua) and of FAIR_READ_ACQUIRE
-- (after node_now.lua, the prelude `local kind, readers_share = 'r', true` and
-- fair_gate.lua): a reader joins a read-write lock.
--
-- KEYS[1]  the writer key
-- KEYS[2]  the readers: reader tokens scored by their expiry, in ms on this node's clock
-- KEYS[3]  the intents: waiting writers' ids scored by their expiry
-- KEYS[4], KEYS[5]  (fair only) the queue and its expiries, read by the gate
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
-- ARGV[3]  (fair only) unused, so that the gate's arguments sit where a writer's do
-- ARGV[4..7]  (fair only) waiter id, ticket, entry TTL, join, read by the gate
--
-- Returns 1 when the reader went in, 0 when refused, and (fair only) 2 + rank when refused
-- with the reader queued (see fair_gate.lua).
-- One EXISTS tells what is there: it counts a key once per mention, so the writer key and the
-- intents (named twice) add 2 each and the readers 1. Even: no reader set; 2 or more: a writer
-- or intents.
local there = redis.call('exists', KEYS[1], KEYS[1], KEYS[3], KEYS[3], KEYS[2])
local readers = there % 2 == 1
local now
if there >= 2 then
  -- A writer holds the lock.
  if redis.call('exists', KEYS[1]) == 1 then return refused() end
  now = node_now()
  -- A live writer intent refuses a reader outside the queue. A reader the queue let through
  -- (queued, with only readers ahead) ignores intents: the queue already put it ahead of
  -- every queued writer, and the intent of a writer behind it would otherwise refuse it while
  -- the queue refuses that writer, and neither would ever go.
  if not queued then
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
    if redis.call('exists', KEYS[3]) == 1 then return refused() end
  end
else
  now = node_now()
end
local ttl = tonumber(ARGV[2])
-- Add this reader, scored by its expiry on this node's clock, and keep the set's TTL at least as
-- long as its longest-lived reader, so an abandoned set disappears. A set this reader creates
-- holds nothing to prune and takes this reader's TTL. In a set that was there, prune the
-- expired readers (this one, just added with a positive TTL, is never among them, so the set
-- stays).
redis.call('zadd', KEYS[2], now + ttl, ARGV[1])
if not readers then
  redis.call('pexpire', KEYS[2], ttl)
else
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
  if redis.call('pttl', KEYS[2]) < ttl then redis.call('pexpire', KEYS[2], ttl) end
end
return won()
