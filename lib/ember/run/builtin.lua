-- ember.run.builtin — makes experiments: the built-in ones by name (lib/ember/experiments/, shipped
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

-- compile(path) -> what the experiment file returns (a factory, or the experiment table), so that
-- a broken file fails before a model is loaded. Errors name the file.
function M.compile(path)
  local chunk, err = loadfile(path)
  if not chunk then error(err, 0) end
  local ok, made = pcall(chunk)
  if not ok then
    local msg = tostring(made)
    error(msg:find(path, 1, true) == 1 and msg or (path .. ": " .. msg), 0)
  end
  return made
end

-- make(made, path, args [, model]) -> the experiment: a factory is called as factory(args, model);
-- a table is the experiment itself. Errors raised inside the file already carry "path:line:".
function M.make(made, path, args, model)
  if type(made) == "function" then
    local ok, exp = pcall(made, args, model)
    if not ok then
      local msg = tostring(exp)
      error(msg:find(path, 1, true) == 1 and msg or (path .. ": " .. msg), 0)
    end
    made = exp
  end
  return check(made, path)
end

-- load(path, args [, model]) -> the experiment an experiment file makes (compile + make).
function M.load(path, args, model)
  return M.make(M.compile(path), path, args, model)
end

-- args(s) -> what --experiment-args gives a factory: key=value pairs (blanks or commas between)
-- as a table of strings ({} for none); any other string (e.g. "4:attention") unchanged.
function M.args(s)
  if s == nil then return {} end
  return require("ember.run.selectors").parse_kv(s) or s
end

-- handle(model) -> what a factory may use of the model before any run: info, tokenize,
-- detokenize and (when the core has it) unembed; no sessions, no generation.
function M.handle(model)
  local h = { info = model.info }
  function h.tokenize(_, text, opts) return model:tokenize(text, opts) end
  function h.detokenize(_, ids) return model:detokenize(ids) end
  if model.unembed then
    function h.unembed(_, t) return model:unembed(t) end
  end
  return h
end

-- experiment(name, args) -> the experiment made by the built-in ember.experiments.<name>
-- ("activation_stats", "zero_layer_output", "ablate_expert").
function M.experiment(name, args)
  local factory = require("ember.experiments." .. name)
  return check(factory(args), "ember.experiments." .. name)
end

return M
