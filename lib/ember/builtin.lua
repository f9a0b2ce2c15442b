-- ember.builtin — finds and instantiates the experiment files shipped in scripts/experiments/
-- (activation_stats.lua, zero_layer_output.lua, ...) for the CLI and the workflows.
-- Must not hold experiment logic: the files themselves are the reference implementations.

local M = {}

-- path(rel) -> an existing path for `rel` (e.g. "scripts/experiments/x.lua"), searched in
-- $EMBER_HOME, then the source tree this library was loaded from, then the current directory.
function M.path(rel)
  local candidates = {}
  local home = os.getenv("EMBER_HOME")
  if home and home ~= "" then candidates[#candidates + 1] = home .. "/" .. rel end
  local me = package.searchpath("ember.builtin", package.path)
  if me then
    local root = me:match("^(.*)/lib/ember/builtin%.lua$")
    if root then candidates[#candidates + 1] = (root == "" and "." or root) .. "/" .. rel end
  end
  candidates[#candidates + 1] = rel
  for _, c in ipairs(candidates) do
    local f = io.open(c, "rb")
    if f then f:close(); return c end
  end
  error("cannot find " .. rel .. " (set EMBER_HOME to the ember source tree)", 0)
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
  if type(made) ~= "table" or type(made.name) ~= "string" or made.name == "" then
    error(path .. " must return an experiment table with a name, or a function that makes one", 0)
  end
  return made
end

-- experiment(file, args) -> the experiment made by scripts/experiments/<file>'s factory.
function M.experiment(file, args)
  return M.load(M.path("scripts/experiments/" .. file), args)
end

return M
