-- ember.model — the Lua side of ember.Model: model:generate, model:run_with_cache and the token
-- helpers added to the core's class, and load{} (ember.load: the core's loader plus tokenizer
-- files and trace=).
-- Must not hide core errors: they already name the function and the argument.

local core = require("ember.core")
local tokenizer = require("ember.model.tokenizer")
local trace = require("ember.model.trace")

local M = {}

-- model:generate{...} is written in Lua on the core's primitives (lib/ember/model/generate.lua)
core.classes.Model.__methods.generate = require("ember.model.generate").generate
-- model:run_with_cache{ ids= | prompt=, stages=, layers=, all_logits= } -> cache (lib/ember/model/cache.lua)
core.classes.Model.__methods.run_with_cache = require("ember.model.cache").run_with_cache
-- model:gradients{ ids= | prompt=, metric=, stages=, freeze=, values= } -> gradients
-- (lib/ember/model/gradients.lua)
core.classes.Model.__methods.gradients = require("ember.model.gradients").gradients
-- m:to_tokens(text), m:to_str_tokens(text | ids), m:to_single_token(text) (lib/ember/model/tokens.lua)
do
  local tokens = require("ember.model.tokens")
  for _, k in ipairs({ "to_tokens", "to_str_tokens", "to_single_token" }) do
    core.classes.Model.__methods[k] = tokens[k]
  end
end

-- The options of ember.load: the one list its checks and its error messages come from.
M.LOAD_OPTIONS = { "model", "tokenizer", "arch", "kernels", "threads", "allow_nonfinite", "tokenizer_check",
  "provenance", "verify_model", "kv_cache", "trace", "override" }

local function is_ember_tokenizer(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__name == "ember.Tokenizer"
end

-- Errors of ember.load read as if the caller had raised them: a position on this file's lines (a
-- core function called from here) is dropped and the caller's put instead (none when the caller
-- is C, e.g. pcall), so no message shows a position inside lib/ember.
local HERE = debug.getinfo(1, "S").short_src .. ":"
local function rethrow(e, level)
  if type(e) ~= "string" then error(e, 0) end
  if e:sub(1, #HERE) == HERE then e = e:gsub("^[^\n]-:%d+: ", "", 1) end
  error(e, level + 1)
end

local function load(opts)
  if type(opts) == "string" then return core.load(opts) end
  if type(opts) ~= "table" then
    error("bad argument #1 to 'load' (table of options or model path expected, got " .. type(opts) .. ")", 0)
  end
  core.internal.check_options(opts, "load", M.LOAD_OPTIONS)
  local copy = {}
  for k, v in pairs(opts) do
    if k ~= "tokenizer" and k ~= "tokenizer_check" and k ~= "trace" then copy[k] = v end
  end
  if opts.tokenizer_check ~= nil and type(opts.tokenizer_check) ~= "boolean" then
    error("bad argument #1 to 'load' (option 'tokenizer_check' must be a boolean, got "
      .. type(opts.tokenizer_check) .. ")", 0)
  end
  local tok = opts.tokenizer
  if tok ~= nil and type(tok) ~= "string" and type(tok) ~= "userdata" then
    error("bad argument #1 to 'load' (option 'tokenizer' must be a tokenizer.json path or an ember.Tokenizer, got "
      .. type(tok) .. ")", 0)
  end
  if type(tok) == "string" then tok = tokenizer { file = tok } end -- before the model: fail fast
  local model = core.load(copy)
  if tok ~= nil and opts.tokenizer_check ~= false and is_ember_tokenizer(tok) then
    local ok, why = core.tokenizer_check(tok, model)
    if not ok then
      model:close()
      error("load: " .. why, 0)
    end
  end
  if tok ~= nil then model:set_tokenizer(tok) end
  -- trace=: every generate of this model writes into one trace (model.trace; finish it with
  -- model.trace:finish())
  if opts.trace ~= nil then
    if type(opts.trace) ~= "string" or opts.trace == "" then
      model:close()
      error("bad argument #1 to 'load' (option 'trace' must be a file path, got " .. type(opts.trace) .. ")", 0)
    end
    trace.for_model(model, trace.open(opts.trace, model))
  end
  return model
end

-- ember.load{ model=, tokenizer=, arch=, kernels=, threads=, allow_nonfinite=, tokenizer_check= }
-- -> ember.Model
-- tokenizer= is a tokenizer.json path or an ember.Tokenizer; without it the model uses the
-- vocabulary embedded in its GGUF (looked up on first use of model.tokenizer). A given
-- ember.Tokenizer is compared with the GGUF's embedded vocabulary, when it has one (size, BOS/EOS,
-- a sample of pieces); tokenizer_check = false skips that. allow_nonfinite = true lets evaluations
-- go on when the logits hold NaN or infinity (by default they fail, naming where it started).
function M.load(opts)
  local ok, model = pcall(load, opts)
  if not ok then rethrow(model, 2) end
  return model
end

return M
