-- ember.cli.control_vector — `ember control-vector --model M --positive FILE --negative FILE
-- --layers A-B --method mean-diff|pca --out cv.gguf`: makes a llama.cpp control vector from pairs of
-- prompts. Must not hold the maths (ember.analysis.cvector) nor the file layout (the tools' writer).

local flags = require("ember.cli.flags")

local M = {}

local usage_error = flags.usage_error

local function method_value(s)
  return require("ember.run.selectors").parse_choice(s, require("ember.analysis.cvector").METHODS, "method")
end
local function range_value(s) return require("ember.run.control_vector").parse_range(s) end

M.FLAGS_LIST = flags.model_command {
  { "positive", "path", "FILE.jsonl", "the positive prompts, one {\"prompt\": ...} per line (required)" },
  { "negative", "path", "FILE.jsonl", "the negative prompts, paired with the positive ones in order (required)" },
  { "layers", range_value, "A-B", "write direction.A .. direction.B (default 1 to the last layer)" },
  { "method", method_value, "M", "mean-diff | pca (default mean-diff)" },
  { "out", "path", "FILE.gguf", "the control vector to write (required; must not exist)" },
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.command_usage("usage: ember control-vector --model FILE.gguf --positive FILE.jsonl "
    .. "--negative FILE.jsonl --out FILE.gguf [options]", M.FLAGS_LIST, {
      "direction.N is made from layer N-1's output and added to layer N's by --control-vector, as in llama.cpp's",
      "cvector-generator. See docs/lua-api.md (Steering and control vectors)." })
end

-- main(args, argv, io_) -> exit code; args[1] is "control-vector" (experiments were refused before:
-- ember.cli). Usage errors are raised (ember.cli.flags).
function M.main(args, _, io_)
  local o = flags.command({ name = "control-vector", spec = M.FLAGS, usage = M.usage,
    required = { "model", "positive", "negative", "out" } }, args, io_)
  if not o then return 0 end
  local fs = require("ember.store.fs")
  if not fs.exists(o.model) then usage_error("--model: cannot open '%s'", o.model) end
  if fs.exists(o.out) then usage_error("--out: '%s' already exists", o.out) end
  if not fs.is_dir(fs.dirname(o.out)) then usage_error("--out: directory '%s' does not exist", fs.dirname(o.out)) end
  local extract = require("ember.analysis.extract")
  local function texts(flag)
    local ok, list = pcall(extract.read_prompts, o[flag], "--" .. flag)
    if not ok then usage_error("%s", list) end
    local out = {}
    for i, p in ipairs(list) do out[i] = p.prompt end
    return out
  end
  local positive, negative = texts("positive"), texts("negative")
  local model = flags.load_model(o)
  local cvector = require("ember.analysis.cvector")
  local cv = cvector.make { model = model, positive = positive, negative = negative, method = o.method,
    layers = o.layers }
  model:close()
  cvector.write(o.out, cv)
  local lo, hi = math.huge, 0
  for _, d in ipairs(cv.directions) do lo, hi = math.min(lo, d.rows), math.max(hi, d.rows) end
  io_.stderr:write(string.format("ember: control-vector: %d pairs, %s, direction.%d-%d (%d to %d difference rows a "
    .. "layer) -> %s\n", cv.pairs, o.method or "mean-diff", cv.directions[1].layer,
    cv.directions[#cv.directions].layer, lo, hi, o.out))
  return 0
end

return M
