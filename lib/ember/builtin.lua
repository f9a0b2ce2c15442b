-- ember.builtin — makes experiments: the built-in ones by name (lib/ember/experiments/, shipped
-- inside the library) and user experiment files by path, for the CLI and the workflows.
-- Must not hold experiment logic, and must not look for files beyond the path it is given.

local M = {}

-- check(made, where) -> made, when it is an experiment table with a name; raises naming `where`.
local function check(made, where)
  if type(made) ~= "table" or type(made.name) ~= "string" or made.name == "" then
    error(where .. " must return an experiment table with a name, or a function that makes one", 0)
  end
  return made
end

-- load(path, args) -> the experiment an experiment file makes: the file returns a factory
-- `function(args) return exp end` (or the experiment table itself). Errors name the file.
function M.load(path, args)
  local chunk, err = loadfile(path)
  if not chunk then error(err, 0) end
  local ok, made = pcall(chunk)
  if ok and type(made) == "function" then ok, made = pcall(made, args) end
  if not ok then
    local msg = tostring(made)
    -- errors raised inside the file already carry "path:line:"
    error(msg:find(path, 1, true) == 1 and msg or (path .. ": " .. msg), 0)
  end
  return check(made, path)
end

-- experiment(name, args) -> the experiment made by the built-in ember.experiments.<name>
-- ("activation_stats", "zero_layer_output").
function M.experiment(name, args)
  local factory = require("ember.experiments." .. name)
  return check(factory(args), "ember.experiments." .. name)
end

return M
