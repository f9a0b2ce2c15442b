-- ember.run.experiment_args — the prologue every example experiment's factory shares: its arguments
-- as a key=value table (from --experiment-args text or a Lua table), typed fields parsed with the
-- selector grammars, and layer numbers checked against the model once it is loaded. Errors carry
-- the experiment's name. Must not hold any experiment's logic.

local selectors = require("ember.run.selectors")

local M = {}

-- kv(args, who) -> table: args itself when a table, else its "k=v ..." text parsed ({} for none).
function M.kv(args, who)
  if type(args) == "table" then return args end
  local kv, err = selectors.parse_kv(type(args) == "string" and args or "")
  if not kv then error(who .. ": " .. err, 0) end
  return kv
end

-- uint(kv, key, who [, default]) -> a non-negative integer from kv[key] (a number or its text).
function M.uint(kv, key, who, default)
  local v = kv[key]
  if v == nil then v = default end
  if math.type(v) == "integer" and v >= 0 then return v end
  local n, err = selectors.parse_uint(tostring(v))
  if not n then error(who .. ": " .. key .. ": " .. err, 0) end
  return n
end

-- number(kv, key, who [, default]) -> a finite number from kv[key].
function M.number(kv, key, who, default)
  local v = kv[key]
  if v == nil then v = default end
  if type(v) == "number" then return v end
  local x, err = selectors.parse_float(tostring(v))
  if not x then error(who .. ": " .. key .. ": " .. err, 0) end
  return x
end

-- list(kv, key, who, default, what) -> "all" | sorted list of integers ("0,2-3", "all").
function M.list(kv, key, who, default, what)
  local v = kv[key]
  if v == nil then v = default end
  local l, err = selectors.parse_index_list(tostring(v), what or key)
  if not l then error(who .. ": " .. key .. ": " .. err, 0) end
  return l
end

-- check_layers(who, layers, n_layers): raises for a layer the model does not have ("all" passes).
function M.check_layers(who, layers, n_layers)
  if layers == "all" then return end
  if type(layers) ~= "table" then layers = { layers } end
  for _, l in ipairs(layers) do
    if l >= n_layers then
      error(string.format("%s: layer %d is out of range (0-%d)", who, l, n_layers - 1), 0)
    end
  end
end

return M
