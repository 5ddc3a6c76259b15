-- Fragment, placed first in every script that reads the node's clock: `node_now()` is that
-- clock in ms. Expiries that scripts write as scores are compared only with the clock of the
-- node that wrote them, exactly as a PX expiry is; no client clock is trusted.
local function node_now()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
