-- FAIR_ACQUIRE_ALL, after node_now.lua: a fair all-or-none acquire. The waiter stands in the
-- fair queue of every key of its set: the mutex queue of that key (see keys.rs), the very queue
-- fair mutex waiters on the key stand in, since a set and a mutex on a shared key exclude each
-- other. It takes the set only when it is the head of every queue it stands in and no key of
-- the set is held, all or none, as ACQUIRE_ALL does.
--
-- Why no order of sets can deadlock: every node orders the same waiters alike, by ticket and
-- then by id, in every queue. The live waiter that comes first is the head of every queue it
-- stands in, so it is refused only by keys that are held, and wins once they are released.
--
-- KEYS[1..n]     the set's keys, sorted
-- KEYS[n+1..3n]  each key's queue and its expiries, in pairs, in the order of the keys
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
-- ARGV[3]  the waiter id (the same on every attempt and every node); its entries are the id
--          alone, as a fair mutex waiter's are
-- ARGV[4]  the ticket (the waiter's place, chosen once)
-- ARGV[5]  the entry TTL in ms
-- ARGV[6]  join: '1' to join even empty queues, '0' to join only non-empty ones
--
-- Returns 1 when every key was taken (and the waiter left every queue), 0 when refused without
-- queueing anywhere, 2 + rank when refused with the waiter queued somewhere, where the rank is
-- the most entries ahead of it in any of its queues (as in fair_gate.lua: 2 is a queued
-- waiter at the head of every queue it stands in, refused by a held key).
local n = #KEYS / 3
local m = ARGV[3]
local ettl = tonumber(ARGV[5])
local qnow = node_now()
local queued, rank = false, 0
for i = 1, n do
  local qk, xk = KEYS[n + 2 * i - 1], KEYS[n + 2 * i]
  -- As in fair_gate.lua: prune dead waiters, then join (or refresh) where the queue is not
  -- empty or joining is due.
  local dead = redis.call('zrangebyscore', xk, '-inf', qnow)
  for j = 1, #dead do
    redis.call('zrem', qk, dead[j])
    redis.call('zrem', xk, dead[j])
  end
  if ARGV[6] == '1' or redis.call('zcard', qk) > 0 then
    queued = true
    redis.call('zadd', qk, ARGV[4], m)
    redis.call('zadd', xk, qnow + ettl, m)
    if redis.call('pttl', qk) < ettl then redis.call('pexpire', qk, ettl) end
    if redis.call('pttl', xk) < ettl then redis.call('pexpire', xk, ettl) end
    local r = redis.call('zrank', qk, m)
    if r > rank then rank = r end
  end
end
-- Not the head of some queue: someone ahead goes first.
if rank > 0 then return 2 + rank end
for i = 1, n do
  if redis.call('exists', KEYS[i]) == 1 then
    if queued then return 2 end
    return 0
  end
end
for i = 1, n do
  redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
for i = 1, n do
  redis.call('zrem', KEYS[n + 2 * i - 1], m)
  redis.call('zrem', KEYS[n + 2 * i], m)
end
return 1
