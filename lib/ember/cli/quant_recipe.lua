-- ember.cli.quant_recipe — `ember quant-recipe --reference A.gguf --quantized B.gguf --prompts FILE.jsonl
-- --out DIR`: which of B's weight groups to keep at higher precision (docs/quant-recipe.md). Writes
-- DIR/tensor-types.txt (llama-quantize's --tensor-type-file), DIR/command.txt, DIR/report.json,
-- DIR/report.txt and the plot, and with llama-quantize at hand quantizes A with the recipe and
-- measures the result on held-out prompts. The first pass resumes from DIR/first-pass.json, runs as
-- shards (--shard I/N, --jobs N) and `ember quant-recipe merge OUT SHARD...` finishes a run from
-- its shards' directories. Must not hold the passes (analysis/quant_select.lua) nor the
-- measurements (analysis/quant_recipe.lua).

local flags = require("ember.cli.flags")

local M = {}

local usage_error = flags.usage_error

local function type_list(s)
  local out = {}
  for t in s:gmatch("[^,]+") do out[#out + 1] = t:lower() end
  if #out == 0 then return nil, "expected types such as q8_0,q6_k" end
  return out
end

M.FLAGS_LIST = {
  { "reference", "path", "A.gguf", "the reference model (f32, f16 or a high-precision quant; required)" },
  { "quantized", "path", "B.gguf", "its quantized copy, the same network (required)" },
  { "prompts", "path", "FILE.jsonl", "the prompts the groups are chosen on, {\"prompt\": ...} a line (required)" },
  { "metric", function(s) return require("ember.sweep.metric").parse(s) end, "M",
    "kl | logit-diff:A,B (token ids or strings): the divergence from A measured (default kl)" },
  { "target", flags.float_in(0, 1, true, false), "S", "the share of B's divergence to recover (default 0.9)" },
  { "budget-mib", flags.float_in(0, nil, true), "N", "at most N MiB added to B (default: no limit)" },
  { "types", type_list, "LIST", "the recipe's types, first that fits a tensor's rows (default q8_0)" },
  { "per-tensor", "bool", nil, "one group per weight tensor (default: a layer's attention, a layer's MLP, "
    .. "output, token_embd)" },
  { "held-out", "path", "FILE.jsonl", "the prompts the verification measures on (not used to choose)" },
  { "split", "bool", nil, "hold out every other prompt of --prompts (2nd, 4th, ...) for the verification" },
  { "out", "path", "DIR", "the output directory: new, or a stopped run's (its first pass resumes; required)" },
  { "shard", function(s) return require("ember.sweep").parse_shard(s) end, "I/N",
    "measure only shard I of N of the first pass (groups i with i mod N = I) into --out, then stop" },
  { "jobs", flags.positive, "N", "run the first pass as N shards in local processes (--out.shards/I), then "
    .. "select" },
  { "llama-quantize", "path", "FILE", "the quantizer (default $LLAMA_QUANTIZE, else "
    .. "../shared/bench/llama.cpp/llama-quantize when it exists)" },
  { "no-verify", "bool", nil, "do not quantize A with the recipe" },
  { "no-plot", "bool", nil, "do not draw the plot" },
  flags.option("threads"),
  flags.option("kernels"),
  flags.option("help"),
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.usage({ "usage: ember quant-recipe --reference A.gguf --quantized B.gguf --prompts FILE.jsonl "
    .. "--out DIR [options]", "", "options:" }, M.FLAGS_LIST,
    { "", "Each group's share of B's divergence from A recovered by taking it from A; a greedy selection",
      "re-measured jointly; the recipe for llama-quantize --tensor-type-file. See docs/quant-recipe.md." })
end

-- The prompts of a file as token ids through A's tokenizer.
local function read_prompts(path, flag, model)
  local ok, list, digest = pcall(require("ember.analysis.extract").read_prompts, path, flag)
  if not ok then usage_error("%s", list) end
  local out = {}
  for i, p in ipairs(list) do out[i] = { text = p.prompt, ids = model:tokenize(p.prompt) } end
  return out, digest
end

local function check_args(o)
  local fs = require("ember.store.fs")
  for _, f in ipairs({ "reference", "quantized", "prompts", "held-out" }) do
    if o[f] and not fs.exists(o[f]) then usage_error("--%s: cannot open '%s'", f, o[f]) end
  end
  if o["held-out"] and o.split then usage_error("--held-out and --split: give one of them") end
  if o.jobs and o.shard then
    usage_error("quant-recipe: --jobs and --shard cannot be combined (--jobs makes the shards)")
  end
  if not fs.is_dir(fs.dirname(o.out)) then usage_error("--out: directory '%s' does not exist", fs.dirname(o.out)) end
  local m = o.metric or { kind = "kl", tokens = {} }
  if m.kind ~= "kl" and m.kind ~= "logit-diff" then
    usage_error("--metric: quant-recipe measures kl or logit-diff:A,B, not %s", m.kind)
  end
  if m.kind == "logit-diff" and #m.tokens ~= 2 then usage_error("--metric: logit-diff needs its two tokens A,B") end
  return m
end

-- the quantizer's path, or nil and why there is none
local function find_quantizer(o)
  local fs = require("ember.store.fs")
  if o["no-verify"] then return nil, "--no-verify" end
  local p = o["llama-quantize"] or os.getenv("LLAMA_QUANTIZE")
  if p and p ~= "" then
    if not fs.exists(p) then usage_error("llama-quantize: '%s' does not exist", p) end
    return p
  end
  p = "../shared/bench/llama.cpp/llama-quantize"
  if fs.exists(p) then return p end
  return nil, "no llama-quantize: set LLAMA_QUANTIZE or give --llama-quantize"
end

-- `ember quant-recipe merge OUT SHARD...`: the run the shards were made for (their recorded flags),
-- into OUT, with every group they measured
local function run_merge(args, argv, io_)
  local dirs = flags.operands("quant-recipe merge", args, function()
    return "usage: ember quant-recipe merge OUT SHARD_DIR...\n\nFinishes a sharded quant-recipe run into OUT: "
      .. "the flags its shards recorded, every group they measured taken as it is.\n"
  end, io_)
  if not dirs then return 0 end
  if #dirs < 2 then usage_error("quant-recipe merge needs OUT and at least one shard directory") end
  local out = table.remove(dirs, 1)
  local fp = require("ember.analysis.quant_first_pass")
  local doc
  for _, d in ipairs(dirs) do
    local ok, got = pcall(fp.read, d)
    if not ok then usage_error("%s", (tostring(got):gsub("^quant%-recipe: ", ""))) end
    if not got then usage_error("quant-recipe merge: '%s' holds no %s (not a shard directory)", d, fp.FILE) end
    if type(got.args) ~= "table" then usage_error("quant-recipe merge: %s records no flags", got.path) end
    doc = doc or got
  end
  local again = { "quant-recipe" }
  for _, a in ipairs(doc.args) do again[#again + 1] = a end
  again[#again + 1] = "--out"
  again[#again + 1] = out
  return M.main(again, argv, io_, dirs)
end

-- main(args, argv, io_ [, from]) -> exit code; args[1] is "quant-recipe"; from: shard directories whose
-- measured groups are taken (quant-recipe merge)
function M.main(args, argv, io_, from)
  if args[2] == "merge" then return run_merge(args, argv, io_) end
  local o = flags.command({ name = "quant-recipe", spec = M.FLAGS, usage = M.usage,
    required = { "reference", "quantized", "prompts", "out" } }, args, io_)
  if not o then return 0 end
  local metric = check_args(o)
  local okt, types = pcall(require("ember.analysis.quant_recipe").check_types, o.types or { "q8_0" },
    require("ember.core").WEIGHT_TYPES)
  if not okt then usage_error("%s", (tostring(types):gsub("^quant%-recipe: ", ""))) end
  local quantizer, why_not = find_quantizer(o)
  local run = require("ember.cli.quant_recipe_run")
  return run.run({ o = o, metric = metric, types = types, quantizer = quantizer, why_not = why_not,
    read_prompts = read_prompts, from = from or {},
    args = flags.without(args, 2, M.FLAGS, { out = true, shard = true, jobs = true }) }, io_)
end

return M
