-- The body of SEM_ACQUIRE (after node_now.lua and no_queue.lua) and of FAIR_SEM_ACQUIRE
-- (after node_now.lua, the prelude `local kind, readers_share = '', false` and fair_gate.lua):
-- a holder takes one of this node's slots of a counting semaphore.
--
-- KEYS[1]  the holders: tokens scored by their expiry, in ms on this node's clock, and the
--          marker member '=' scored by minus the semaphore's shape (ARGV[3])
-- KEYS[2], KEYS[3]  (fair only) the queue and its expiries, read by the gate
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
-- ARGV[3]  the shape: the permits k when each node admits k live holders (its slots c = k),
--          c + k * 2^21 when it admits c < k
-- ARGV[4..7]  (fair only) waiter id, ticket, entry TTL, join, read by the gate
--
-- Returns 1 when the holder went in, 0 when every slot is taken, and (fair only) 2 + rank when
-- refused with the waiter queued (see fair_gate.lua). Fails when the semaphore was created here
-- with another shape (or the key is a string: one slot per node, or another lock): clients
-- that disagree on it would together admit more holders than either allows.
local shape = tonumber(ARGV[3])
local cap = shape % 2097152
local function says(s)
  if s < 2097152 then return tostring(s) .. ' permits' end
  return tostring((s - s % 2097152) / 2097152) .. ' permits, ' .. tostring(s % 2097152) ..
    ' per node'
end
local mark = redis.pcall('zscore', KEYS[1], '=')
-- A string there (WRONGTYPE): the key of a semaphore with one slot per node, or another lock.
if type(mark) == 'table' then
  return redis.error_reply('ERR redlock-mux semaphore has 1 per node or another lock, not ' ..
    says(shape))
end
if mark and -tonumber(mark) ~= shape then
  return redis.error_reply('ERR redlock-mux semaphore has ' .. says(-tonumber(mark)) ..
    ', not ' .. says(shape))
end
local now = node_now()
-- Expired holders go first (their scores are positive; the marker's is not), so a holder that
-- died frees its slot when its TTL runs out on this node's clock.
redis.call('zremrangebyscore', KEYS[1], '(0', now)
if redis.call('zcount', KEYS[1], '(0', '+inf') >= cap then return refused() end
local ttl = tonumber(ARGV[2])
redis.call('zadd', KEYS[1], now + ttl, ARGV[1])
if not mark then redis.call('zadd', KEYS[1], -shape, '=') end
-- The set (and its marker) lives as long as its longest-lived holder, so an abandoned
-- semaphore disappears.
if redis.call('pttl', KEYS[1]) < ttl then redis.call('pexpire', KEYS[1], ttl) end
return won()
