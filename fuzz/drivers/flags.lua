-- fuzz/drivers/flags.lua — any bytes as a command line (NUL-separated arguments) through the flag
-- grammar (lib/ember/cli/flags.lua) with the `ember`, `ember benchmark`, `ember sweep` and `ember
-- compare-models` flag lists. Parsing must return options or raise a usage error: any other error,
-- or a numeric option outside its flag's documented range, is a finding.
local flags = require("ember.cli.flags")
local cli = require("ember.cli")

local specs = {
  flags.spec(cli.FLAGS), require("ember.cli.benchmark").FLAGS, require("ember.cli.compare_artifacts").FLAGS,
  require("ember.cli.sweep").FLAGS, require("ember.cli.compare_models").FLAGS,
}

local RANGES = { ["top-k"] = { 0, flags.MAX_TOP_K }, threads = { 0, flags.MAX_THREADS },
  ["max-tokens"] = { 0, flags.MAX_CONTEXT }, context = { 1, flags.MAX_CONTEXT } }

return function(data)
  local args = {}
  for part in (data .. "\0"):gmatch("([^%z]*)%z") do args[#args + 1] = part end
  if #data == 0 then args = {} end
  for k, spec in ipairs(specs) do
    local ok, o = pcall(flags.parse, args, 1, spec)
    if not ok then
      if not flags.is_usage_error(o) then error("flags.parse raised a non-usage error: " .. tostring(o), 0) end
    elseif k == 1 then
      for name, r in pairs(RANGES) do
        local v = o[name]
        if v ~= nil and (math.type(v) ~= "integer" or v < r[1] or v > r[2]) then
          error(string.format("--%s = %s is outside %d..%d", name, tostring(v), r[1], r[2]), 0)
        end
      end
      local t, p = o.temperature, o["top-p"]
      if t ~= nil and not (t >= 0) then error("--temperature " .. tostring(t) .. " accepted", 0) end
      if p ~= nil and not (p > 0 and p <= 1) then error("--top-p " .. tostring(p) .. " accepted", 0) end
    end
  end
end
