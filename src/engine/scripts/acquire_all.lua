-- ACQUIRE_ALL: an all-or-none lock takes every key of its set on this node, or none of them.
-- Each key holds the set's token as a plain string, as a mutex key holds its token, so a set
-- and a mutex exclude each other on every key they share.
--
-- KEYS     the set's keys (sorted by the client, so the same set always sends the same command)
-- ARGV[1]  this attempt's token
-- ARGV[2]  the TTL in ms
--
-- Returns 1 when every key was taken, 0 when any of them exists (and nothing was set).
-- Check every key before setting any: there is never a partial hold on a node.
for i = 1, #KEYS do
  if redis.call('exists', KEYS[i]) == 1 then return 0 end
end
for i = 1, #KEYS do
  redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
