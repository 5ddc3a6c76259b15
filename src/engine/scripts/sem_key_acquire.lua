-- The body of FAIR_SEM_KEY_ACQUIRE (after node_now.lua, the prelude
-- `local kind, readers_share = '', false` and fair_gate.lua): a holder takes a semaphore's one
-- slot on this node, the key, as the unfair acquire does with `SET key value NX PX ttl GET`
-- and no script.
--
-- KEYS[1]  the semaphore's key: the holder's token followed by the mark (ARGV[3])
-- KEYS[2], KEYS[3]  the queue and its expiries, read by the gate
-- ARGV[1]  this attempt's token followed by the mark
-- ARGV[2]  the TTL in ms
-- ARGV[3]  the mark: ':sem:' and the permits
-- ARGV[4..7]  waiter id, ticket, entry TTL, join, read by the gate
--
-- Returns 1 when the holder went in (or was already in), 0 when another holder of the same
-- semaphore has the key, 2 + rank when refused with the waiter queued (see fair_gate.lua).
-- Fails when the key holds something else: a sorted set (a semaphore with more slots per node,
-- or an older version), another number of permits, or another lock's value.
local held = redis.pcall('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(held) == 'table' then
  return redis.error_reply('ERR redlock-mux semaphore has more than 1 per node, not ' ..
    string.sub(ARGV[3], 6) .. ' permits, 1 per node')
end
if not held or held == ARGV[1] then return won() end
local mark = ARGV[3]
if #held > #mark and string.sub(held, -#mark) == mark then return refused() end
local other = string.match(held, ':sem:(%d+)$')
if other then
  return redis.error_reply('ERR redlock-mux semaphore has ' .. other .. ' permits, 1 per node, not ' ..
    string.sub(ARGV[3], 6) .. ' permits, 1 per node')
end
return redis.error_reply('ERR redlock-mux semaphore has another lock there, not ' ..
  string.sub(ARGV[3], 6) .. ' permits, 1 per node')
