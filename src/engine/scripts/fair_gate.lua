-- Fragment: the fair queue's gate, which every fair acquire script starts with (after
-- node_now.lua). A one-line prelude before it sets its two parameters:
--   kind           what a queue entry starts with: '' for a mutex, 'r' or 'w' for a reader or
--                  a writer of a read-write lock;
--   readers_share  whether readers may go together: true only for a reader, which may pass
--                  when everyone ahead of it in the queue is a reader.
--
-- KEYS[#KEYS - 1]  the queue: entries (kind ++ waiter id) scored by ticket
-- KEYS[#KEYS]      the queue's expiries: the same entries scored by when each expires, in ms
--                  on this node's clock
-- ARGV[#ARGV - 3]  the waiter id (the same on every attempt and every node)
-- ARGV[#ARGV - 2]  the ticket (the waiter's place, chosen once)
-- ARGV[#ARGV - 1]  the entry TTL in ms
-- ARGV[#ARGV]      '1' to join even an empty queue, '0' to join only a non-empty one
--
-- It refuses with 2 + rank unless everyone ahead of this waiter may go first, and then lets
-- the script's body run. The rank is how many entries ahead of this waiter must leave the
-- queue before it may pass: for a mutex or a writer, every entry ahead; for a reader, every
-- entry up to and including the last writer ahead (the readers at the front, "the heads",
-- have rank 0). A client learns from it how many releases to let pass before it tries again.
-- Answers 0 and 1 keep their meaning (refused without queueing, taken), and 2 is still a
-- refusal that left the waiter queued, at the head. It defines for the body:
--   queued     whether this waiter is in the queue now;
--   won()      takes this waiter out of the queue and answers 1;
--   refused()  answers 2 (rank 0: this waiter may pass the gate, the lock is what refuses it)
--              when this waiter is queued (the client keeps waiting in line), and 0 when it
--              is not.
local m = kind .. ARGV[#ARGV - 3]
local qk, xk = KEYS[#KEYS - 1], KEYS[#KEYS]
local ettl = tonumber(ARGV[#ARGV - 1])
local queued = false
local function won()
  redis.call('zrem', qk, m)
  redis.call('zrem', xk, m)
  return 1
end
local function refused()
  if queued then return 2 end
  return 0
end
-- Entries of waiters that stopped refreshing them (they died, or gave up without reaching
-- this node) expire on this node's clock; prune them first, so a dead waiter blocks nobody.
local qnow = node_now()
local dead = redis.call('zrangebyscore', xk, '-inf', qnow)
for i = 1, #dead do
  redis.call('zrem', qk, dead[i])
  redis.call('zrem', xk, dead[i])
end
-- While the queue is empty and the waiter need not join yet, a fair acquire costs what an
-- unfair one does.
if ARGV[#ARGV] == '1' or redis.call('zcard', qk) > 0 then
  queued = true
  -- Join, or refresh the entry: ZADD keeps a queued waiter's place (its ticket does not
  -- change) and moves its expiry ahead.
  redis.call('zadd', qk, ARGV[#ARGV - 2], m)
  redis.call('zadd', xk, qnow + ettl, m)
  -- Both sets outlive their longest-lived entry, and no longer, so an abandoned queue goes.
  if redis.call('pttl', qk) < ettl then redis.call('pexpire', qk, ettl) end
  if redis.call('pttl', xk) < ettl then redis.call('pexpire', xk, ettl) end
  -- Equal tickets are ordered by member, so every node orders the same waiters alike.
  local rank = redis.call('zrank', qk, m)
  if rank > 0 then
    if not readers_share then return 2 + rank end
    -- A reader waits for the last writer ahead of it, and for everyone ahead of that writer.
    local ahead = redis.call('zrange', qk, 0, rank - 1)
    for i = #ahead, 1, -1 do
      if string.sub(ahead[i], 1, 1) == 'w' then return 2 + i end
    end
  end
end
