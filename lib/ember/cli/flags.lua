-- ember.cli.flags — the one flag grammar of ember's commands (the `ember` CLI and the workflow scripts):
-- `--name VALUE`, `--name=VALUE`, boolean `--name`, each flag at most once (unless marked
-- repeatable), values converted by kind, and usage errors that name the flag; the options every
-- model-loading command shares (one row each) and the one mapping of them to ember.load{}; the
-- prologue every subcommand opens with. Must not know any one command's flags, nor run anything but
-- that model load.
--
-- A flag list is { { name, kind, META, help [, many = true] }, ... }; kind is "string" (any value),
-- "path" (non-empty), "uint", "float", "bool" (no value), or a parse function s -> value | nil,
-- message (M.uint_in and M.float_in make range-checked ones). A flag with `many = true` may be
-- given several times; its value is then the list of converted values in command-line order.

local selectors = require("ember.run.selectors")

local M = {}

-- ---- value kinds shared by several commands -----------------------------------------------------

-- the choices of --kernels: the kernels' own list (cpu.h), exported by the core
M.KERNEL_SETS = require("ember.core").kernel_sets

-- The engine's own limits, so a flag beyond them is a usage error rather than a failed run: the
-- largest session (src/engine/session.c), the thread cap of ember.load, the sampler's int top_k.
M.MAX_CONTEXT = 1 << 24
M.MAX_THREADS = 4096
M.MAX_TOP_K = 2147483647

function M.kernels(s) return selectors.parse_choice(s, M.KERNEL_SETS, "kernel set") end

-- uint(s) -> the integer, or nil and a message that tells digits too large for any integer
-- ("out of range") from text that is not a non-negative integer at all.
local MAXINT_TEXT = tostring(math.maxinteger)
local function uint(s)
  local n, err = selectors.parse_uint(s)
  if n ~= nil then return n end
  if type(s) == "string" and s:find("^%d+$") then
    -- the 19-digit values up to math.maxinteger are integers too (parse_uint stops at 18 digits)
    local digits = s:gsub("^0+", "")
    if #digits == #MAXINT_TEXT and digits <= MAXINT_TEXT then return math.tointeger(tonumber(digits)) end
    return nil, string.format("%s is out of range (at most %s)", s, MAXINT_TEXT)
  end
  return nil, err
end
M.uint = uint

function M.positive(s)
  local n, err = uint(s)
  if n == nil then return nil, err end
  if n < 1 then return nil, "expected a positive integer, got '" .. s .. "'" end
  return n
end

-- uint_in(lo, hi [, why]) -> a kind: an integer in lo..hi; `why` says where the bound comes from.
function M.uint_in(lo, hi, why)
  return function(s)
    local n, err = uint(s)
    if n == nil then return nil, err end
    if n < lo or n > hi then
      return nil, string.format("%s is out of range (%d..%d%s)", s, lo, hi, why and ("; " .. why) or "")
    end
    return n
  end
end

-- float_in(lo, hi, lo_open, hi_open) -> a kind: a finite number in the interval (hi nil: no upper
-- bound); the message shows the interval in the usual bracket notation.
function M.float_in(lo, hi, lo_open, hi_open)
  local range = (lo_open and "(" or "[") .. tostring(lo) .. ", " .. (hi and tostring(hi) or "inf")
    .. ((hi_open or not hi) and ")" or "]")
  return function(s)
    local x, err = selectors.parse_float(s)
    if x == nil then return nil, err end
    if x < lo or (lo_open and x == lo) or (hi and (x > hi or (hi_open and x == hi))) then
      return nil, string.format("%s is out of range %s", s, range)
    end
    return x
  end
end

-- ---- the options the commands share ---------------------------------------------------------------

-- the family names of --arch's help: the engine's family table, in its order
local function family_names()
  local names = {}
  for i, f in ipairs(require("ember.core").FAMILIES) do names[i] = f.name end
  return table.concat(names, ", ")
end

local function kv_cache_value(v) return selectors.parse_choice(v, { "f32", "f16", "bf16" }, "KV cache type") end

-- One row each ({ name, kind, META, help }), for every command that loads a model: so --threads is
-- checked one way everywhere and the kernel sets are listed once (the core's own list).
local SHARED = {
  model = { "model", "path", "FILE.gguf", "the model (required)" },
  tokenizer = { "tokenizer", "path", "FILE", "tokenizer.json (default: the tokenizer embedded in the GGUF)" },
  arch = { "arch", "string", "ARCH", "refuse the model unless its family is ARCH (" .. family_names() .. ")" },
  threads = { "threads", M.uint_in(0, M.MAX_THREADS), "N", "worker threads (default: the physical cores)" },
  kernels = { "kernels", M.kernels, "SET", table.concat(M.KERNEL_SETS, " | ") .. " (default auto)" },
  ["kv-cache"] = { "kv-cache", kv_cache_value, "TYPE",
    "KV cache type: f32 (default, exact) | f16 | bf16 (half the memory)" },
  ["verify-model"] = { "verify-model", "bool", nil,
    "hash the model file for the manifest even when the digest cache knows it" },
  temperature = { "temperature", M.float_in(0, nil), "T", "0 = greedy (default 0)" },
  ["top-k"] = { "top-k", M.uint_in(0, M.MAX_TOP_K), "K", "sample among the K most likely tokens (0 = off)" },
  ["top-p"] = { "top-p", M.float_in(0, 1, true, false), "P", "nucleus sampling threshold (1 = off)" },
  context = { "context", M.uint_in(1, M.MAX_CONTEXT, "the largest session"), "N",
    "session positions (default: prompt + max-tokens, within the model's context_length; N may go beyond it)" },
  help = { "help", "bool", nil, "show this help" },
  ["override-from"] = { "override-from", "path", "A.gguf",
    "take the tensors of --override-tensors from this file (same architecture and shapes, any weight type)" },
  ["override-tensors"] = { "override-tensors", function(v) return M.parse_override_tensors(v) end, "LIST|REGEX",
    "tensors to take from --override-from: names a,b,c, or a POSIX extended regex of whole names "
      .. "(any of ^$*+?()[]{}|\\ makes it one)" },
}

-- parse_override_tensors(v) -> a list of tensor names, or the regex string (a value with any of
-- ^$*+?()[]{}|\ in it; '.' alone, as in every tensor name, does not make a regex).
function M.parse_override_tensors(v)
  if v:find("[%^%$%*%+%?%(%)%[%]{}|\\]") then return v end
  local names = {}
  for name in v:gmatch("[^,]+") do names[#names + 1] = name end
  if #names == 0 or v:find(",,", 1, true) or v:find("^,") or v:find(",$") then
    return nil, "expected tensor names a,b,c or a regex, got '" .. v .. "'"
  end
  return names
end

-- The help of --model for the commands that fall back on the default model (ember.model.default_model).
M.DEFAULT_MODEL_HELP = "the model (default: the tiny llama made on first use in ~/.cache/ember)"

-- option(name [, help]) -> a copy of the shared row of --name, with its own help text when given.
function M.option(name, help)
  local row = SHARED[name]
  if not row then error("flags.option: no shared option '" .. tostring(name) .. "'", 2) end
  return { row[1], row[2], row[3], help or row[4] }
end

-- model_command(own) -> the flag list of a command that loads a model: --model and --tokenizer
-- first, the command's own rows, then --threads, --kernels and --help (the order --help prints).
function M.model_command(own)
  local list = { M.option("model"), M.option("tokenizer") }
  for _, row in ipairs(own) do list[#list + 1] = row end
  for _, name in ipairs({ "threads", "kernels", "help" }) do list[#list + 1] = M.option(name) end
  return list
end

-- load_model(o [, extra]) -> the model the shared options of o name (--model, --tokenizer, --arch,
-- --kernels, --threads, --kv-cache, --verify-model, --override-from with --override-tensors), through
-- ember.load; extra adds load options or replaces them (model = a default path, provenance = true).
-- A failed load is a run failure (exit 1) with the loader's message, which names the file or the
-- option.
function M.load_model(o, extra)
  local opts = { model = o.model, tokenizer = o.tokenizer, arch = o.arch, kernels = o.kernels, threads = o.threads,
    kv_cache = o["kv-cache"], verify_model = o["verify-model"] == true }
  if (o["override-from"] == nil) ~= (o["override-tensors"] == nil) then
    M.usage_error("--override-from and --override-tensors go together (given: --%s)",
      o["override-from"] and "override-from" or "override-tensors")
  end
  if o["override-from"] then opts.override = { from = o["override-from"], tensors = o["override-tensors"] } end
  for k, v in pairs(extra or {}) do opts[k] = v end
  local ok, model = pcall(require("ember").load, opts)
  if not ok then error(tostring(model), 0) end
  return model
end

-- ---- usage errors -------------------------------------------------------------------------------

-- Raised as tables so a command can tell them (exit 2) from run failures (exit 1).
local UsageError = {}
UsageError.__tostring = function(e) return e.msg end

function M.usage_error(msg, ...)
  error(setmetatable({ msg = string.format(msg, ...) }, UsageError), 0)
end
local usage_error = M.usage_error

function M.is_usage_error(e) return getmetatable(e) == UsageError end

-- ---- parsing ------------------------------------------------------------------------------------

-- spec(list) -> name -> { name, kind, meta, help }, the form parse() looks flags up in.
function M.spec(list)
  local spec = {}
  for _, f in ipairs(list) do spec[f[1]] = { name = f[1], kind = f[2], meta = f[3], help = f[4], many = f.many } end
  return spec
end

local function convert(flag, value)
  local kind = flag.kind
  if kind == "string" then return value end
  if kind == "path" then
    if value == "" then usage_error("--%s: expected a path, got an empty string", flag.name) end
    return value
  end
  local parse = kind
  if kind == "uint" then parse = uint
  elseif kind == "float" then parse = selectors.parse_float end
  local v, err = parse(value)
  if v == nil then usage_error("--%s: %s", flag.name, err) end
  return v
end

-- How far (case and '_' set aside) a misspelt flag may be from a flag to be named as the one meant:
-- the rule the hook names use (core.internal.closest, lember.c).
M.NEAR_MISS = 2

-- near(name, spec) -> the flag of spec that `name` misspells, or nil
local function near(name, spec)
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  local best, d = require("ember.core").internal.closest(name, names)
  if best and d <= M.NEAR_MISS then return best end
  return nil
end

-- unknown_flag(name, spec): the usage error for a flag spec does not hold, naming the nearest one
-- ("--max-token" -> "did you mean '--max-tokens'?") when it is a near miss.
local function unknown_flag(name, spec)
  local best = near(name, spec)
  if best then usage_error("unknown flag '--%s' (did you mean '--%s'?)", name, best) end
  usage_error("unknown flag '--%s'", name)
end

-- malformed(tok, msg, spec): the usage error for a token the grammar refuses, with the flag it
-- misspells when it is one ("--capture_stages" -> "--capture-stages").
local function malformed(tok, msg, spec)
  local name = type(tok) == "string" and tok:match("^%-%-([^=]+)")
  local best = name and near(name, spec)
  if best then usage_error("%s (did you mean '--%s'?)", msg, best) end
  usage_error("%s", msg)
end

-- parse(args, first, spec) -> opts, positionals: args[first..] against spec (from M.spec).
-- Raises a usage error naming the flag.
function M.parse(args, first, spec)
  local opts, positionals = {}, {}
  local i = first
  while i <= #args do
    local tok = args[i]
    local name, value = selectors.parse_flag(tok)
    if name == false then malformed(tok, value, spec) end
    if name == nil then
      positionals[#positionals + 1] = tok
    else
      local flag = spec[name]
      if not flag then unknown_flag(name, spec) end
      if opts[name] ~= nil and not flag.many then usage_error("flag '--%s' given more than once", name) end
      if flag.kind == "bool" then
        if value ~= nil then usage_error("flag '--%s' takes no value (got '%s')", name, value) end
        opts[name] = true
      else
        if value == nil then
          i = i + 1
          value = args[i]
          local next_name = value and selectors.parse_flag(value)
          if value == nil or (next_name and spec[next_name]) then
            usage_error("flag '--%s' needs a value (%s)", name, flag.meta or "VALUE")
          end
        end
        if flag.many then
          opts[name] = opts[name] or {}
          opts[name][#opts[name] + 1] = convert(flag, value)
        else
          opts[name] = convert(flag, value)
        end
      end
    end
    i = i + 1
  end
  return opts, positionals
end

-- present(args, first, names) -> the first of `names` given as a flag in args[first..], or nil.
-- For refusing flags before the rest of the command line is parsed.
function M.present(args, first, names)
  for i = first, #args do
    local name = selectors.parse_flag(args[i])
    for _, k in ipairs(names) do
      if name == k then return k end
    end
  end
  return nil
end

-- pairs_or_prompts(o, name): a dataset (--pairs FILE.jsonl) or one pair (--clean and --corrupted),
-- never both and never neither: a usage error naming the command otherwise.
function M.pairs_or_prompts(o, name)
  if o.pairs then
    if o.clean or o.corrupted then
      usage_error("%s: --pairs replaces --clean and --corrupted; give one or the other", name)
    end
    return
  end
  for _, k in ipairs({ "clean", "corrupted" }) do
    if o[k] == nil then usage_error("%s: --%s is required (or --pairs FILE.jsonl)", name, k) end
  end
end

-- without(args, first, spec, names) -> args[first..] without the flags in names (a set) and their
-- values: the command line a shard process gets (--jobs, --out and the like are its parent's).
function M.without(args, first, spec, names)
  local out, i = {}, first
  while i <= #args do
    local name, value = selectors.parse_flag(args[i])
    if name and names[name] then
      if value == nil and spec[name] and spec[name].kind ~= "bool" then i = i + 1 end
    else
      out[#out + 1] = args[i]
    end
    i = i + 1
  end
  return out
end

-- command(c, args, io_) -> opts, positionals: the prologue of a subcommand. args[c.first or 2..]
-- parsed against c.spec; with --help, c.usage() is written and nil returned (the command then exits
-- 0); a positional argument is a usage error naming c.name unless c.positionals is true; each flag
-- of c.required (names, in order) that is missing is a usage error "NAME: --FLAG is required".
function M.command(c, args, io_)
  local o, pos = M.parse(args, c.first or 2, c.spec)
  if o.help then
    io_.stdout:write(c.usage())
    return nil
  end
  if #pos > 0 and not c.positionals then
    usage_error("%sunexpected argument '%s'", c.name and (c.name .. ": ") or "", pos[1])
  end
  for _, k in ipairs(c.required or {}) do
    if o[k] == nil then usage_error("%s: --%s is required", c.name, k) end
  end
  return o, pos
end

-- operands(name, args, usage, io_) -> the arguments after args[2] (a subcommand such as `sweep merge`
-- that takes directories only), or nil after printing usage() for --help. Any other flag there is
-- an unknown flag (with its near miss), not taken for a directory's name.
local HELP_ONLY
function M.operands(name, args, usage, io_)
  HELP_ONLY = HELP_ONLY or M.spec({ M.option("help") })
  local _, pos = M.command({ name = name, spec = HELP_ONLY, usage = usage, positionals = true, first = 3 }, args, io_)
  return pos
end

-- ---- experiments and the commands that refuse them ------------------------------------------

-- The flags that make a run an experiment: each attaches hooks that change or record what the
-- network computes. Inspection surfaces (extraction, probes, demo, interactive, benchmark) refuse
-- them (SPEC §7): whether a value would be read before or after the intervention is not defined.
M.EXPERIMENT_FLAGS = { "experiment", "activation-stats", "zero-layer-output", "ablate-expert", "capture-activations",
  "activation-patch", "steer", "control-vector", "sae-steer" }

-- refuse_experiments(what, flag): a usage error when flag (an experiment flag given) is set;
-- `what` names the command or option that runs without experiments.
function M.refuse_experiments(what, flag)
  if flag then
    usage_error("'%s' refuses active experiments (--%s): the meaning of pre- vs post-intervention values "
      .. "is not defined for it", what, flag)
  end
end

-- refuse_experiment_args(what, args, first): the same for a command line not parsed yet, so the
-- refusal comes before anything else is looked at (or the model is loaded).
function M.refuse_experiment_args(what, args, first)
  M.refuse_experiments(what, M.present(args, first, M.EXPERIMENT_FLAGS))
end

-- ---- help text ----------------------------------------------------------------------------------

-- usage(head, list, tail) -> head lines, one line per flag of list ("  --name META   help"),
-- then tail lines; newline-terminated.
function M.usage(head, list, tail)
  local lines = {}
  for _, l in ipairs(head) do lines[#lines + 1] = l end
  for _, f in ipairs(list) do
    local left = "--" .. f[1] .. (f[3] and (" " .. f[3]) or "")
    lines[#lines + 1] = string.format("  %-32s %s", left, f[4])
  end
  for _, l in ipairs(tail or {}) do lines[#lines + 1] = l end
  return table.concat(lines, "\n") .. "\n"
end

-- command_usage(line, list, notes) -> a subcommand's --help: its usage line, "options:", one line
-- per flag of list, then the notes after a blank line.
function M.command_usage(line, list, notes)
  return M.usage({ line, "", "options:" }, list, { "", table.unpack(notes) })
end

-- ---- scripts ------------------------------------------------------------------------------------

-- script(name, list, usage, body, args) -> exit code, for a command-line script: parses args with
-- list; --help prints usage (exit 0); a usage error prints "name: message" and usage (exit 2);
-- body(opts, positionals) returns the exit code (default 0), and an error it raises prints
-- "name: message" (exit 1). Scripts end with os.exit(flags.script(...)).
function M.script(name, list, usage, body, args)
  local ok, code = pcall(function()
    local o, pos = M.parse(args or {}, 1, M.spec(list))
    if o.help then io.stdout:write(usage); return 0 end
    return body(o, pos) or 0
  end)
  if ok then return code end
  if M.is_usage_error(code) then
    io.stderr:write(name, ": ", code.msg, "\n", usage)
    return 2
  end
  io.stderr:write(name, ": ", tostring(code), "\n")
  return 1
end

return M
