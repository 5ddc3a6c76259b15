-- Fragment: what fair_gate.lua defines, for a script without a fair queue. Nobody is queued,
-- `won()` answers 1 and `refused()` 0, so the acquire bodies serve both kinds of script.
local queued = false
local function won() return 1 end
local function refused() return 0 end
