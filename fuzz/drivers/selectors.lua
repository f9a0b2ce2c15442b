-- fuzz/drivers/selectors.lua — any bytes through every LPeg grammar of lib/ember/run/selectors.lua.
-- Each parse_* returns a value or nil and a message; raising, or a value that breaks its own
-- contract (a non-integer layer, an unsorted or repeated index list), is a finding.
local sel = require("ember.run.selectors")

local function check(cond, what, s)
  if not cond then error(string.format("%s for input %q", what, s), 0) end
end

local function is_index_list(v)
  if v == "all" then return true end
  if type(v) ~= "table" then return false end
  for i, x in ipairs(v) do
    if math.type(x) ~= "integer" or x < 0 or (i > 1 and x <= v[i - 1]) then return false end
  end
  return true
end

return function(data)
  -- the input as one string, and its NUL-separated parts (each grammar sees short pieces too)
  local pieces = { data }
  for part in (data .. "\0"):gmatch("([^%z]*)%z") do pieces[#pieces + 1] = part end
  for _, s in ipairs(pieces) do
    local n = sel.parse_uint(s)
    check(n == nil or (math.type(n) == "integer" and n >= 0), "parse_uint gave a bad value", s)
    n = sel.parse_int(s)
    check(n == nil or math.type(n) == "integer", "parse_int gave a bad value", s)
    local x = sel.parse_float(s)
    check(x == nil or (x == x and x ~= math.huge and x ~= -math.huge), "parse_float gave a non-finite value", s)
    sel.parse_flag(s)
    for _, kind in ipairs({ "zero", "patch" }) do
      local v = sel.parse_layer_stage(s, kind)
      check(v == nil or (math.type(v.layer) == "integer" and v.layer >= 0), "parse_layer_stage layer", s)
    end
    local list = sel.parse_index_list(s, "positions")
    check(list == nil or is_index_list(list), "parse_index_list gave an unsorted or invalid list", s)
    local stages = sel.parse_stage_list(s)
    if type(stages) == "table" then
      for _, st in ipairs(stages) do check(sel.STAGE_SET[st], "parse_stage_list gave an unknown stage", s) end
    end
    sel.parse_phase(s)
    sel.parse_choice(s, { "a", "bb", "auto" }, "choice")
    sel.parse_kv(s)
    sel.parse_class(s)
  end
end
