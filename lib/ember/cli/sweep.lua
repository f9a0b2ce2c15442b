-- ember.cli.sweep — the `ember sweep` subcommand: run a causal sweep (or one shard of it, or N
-- shards as local processes), `ember sweep merge OUT SHARD...`, `ember sweep compare A B`.
-- Must not hold sweep logic: it parses flags and hands over to sweep / sweep_merge / sweep_jobs.

local flags = require("ember.cli.flags")
local selectors = require("ember.run.selectors")

local M = {}

local usage_error = flags.usage_error
local positive = flags.positive
local function shard_value(s) return require("ember.sweep").parse_shard(s) end
local metric_mod = require("ember.sweep.metric")
local function metric_value(s) return metric_mod.parse(s) end
local function progress_value(s)
  return selectors.parse_choice(s, { "auto", "tty", "summary", "none" }, "progress mode")
end
local function stage_list(s)
  local v, err = selectors.parse_stage_list(s)
  if v == nil then return nil, err end
  return v
end

M.FLAGS_LIST = {
  flags.option("model"),
  flags.option("tokenizer"),
  { "clean", "string", "TEXT", "the clean prompt (required)" },
  { "corrupted", "string", "TEXT", "the corrupted prompt, same token count (required)" },
  { "pairs", "path", "FILE.jsonl",
    "many pairs instead of --clean/--corrupted: one {\"clean\", \"corrupted\", \"answer\", \"wrong\"} per line" },
  { "metric", metric_value, "M",
    metric_mod.GRAMMAR .. " (default kl); A, B: token ids or strings (\" Paris\"), default the top-1s" },
  { "stages", stage_list, "LIST", "per-layer stages to patch (default after_layer; all = the four)" },
  { "layers", selectors.parse_index_list, "LIST", "layers: all | 0,2,4-6 (default all)" },
  { "positions", selectors.parse_index_list, "LIST",
    "positions: all | 0-3 (default all: the prompt's, and the decode steps')" },
  { "decode-steps", "uint", "N",
    "generate N greedy tokens per run; the metric is read after them and positions run on to prompt+N-1 "
      .. "(default 0)" },
  { "out", "path", "DIR", "the sweep artifact directory (required; an interrupted run resumes in it)" },
  { "shard", shard_value, "I/N", "compute only shard I of N (cells i with i mod N = I)" },
  { "jobs", positive, "N", "run N shards as local processes, then merge them into --out" },
  flags.option("threads", "worker threads per process (default: the physical cores)"),
  flags.option("kernels"),
  { "progress", progress_value, "MODE", "auto | tty | summary | none (default auto: one line on a terminal)" },
  { "max-cells", positive, "N", "stop after computing N new cells (rerun to continue)" },
  { "checkpoint", "float", "SECONDS",
    "write the cells computed so far at most this often (default 1; 0 = every cell)" },
  { "no-plot", "bool", nil, "do not draw the heatmaps" },
  { "no-reuse", "bool", nil,
    "evaluate every cell from position 0 (default: from its position on, over the corrupted run's KV "
      .. "cache; the same bits)" },
  { "no-batch", "bool", nil,
    "with --pairs, evaluate the pairs of a cell one after another (default: in one batch; the same bits)" },
  flags.option("help"),
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.usage({
    "usage: ember sweep --model FILE.gguf --clean TEXT --corrupted TEXT --out DIR [options]",
    "       ember sweep --model FILE.gguf --pairs FILE.jsonl --out DIR [options]",
    "       ember sweep merge OUT SHARD_DIR...",
    "       ember sweep compare SWEEP_A SWEEP_B",
    "",
    "options:",
  }, M.FLAGS_LIST, {
    "",
    "Each cell patches the clean prompt's activation at (stage, layer, position) into the corrupted",
    "prompt's run and measures the next-token logits (after --decode-steps greedy tokens). See docs/sweeps.md.",
  })
end

local function draw(dir, io_)
  local ok, err = pcall(function() return require("ember.sweep.plot").draw(dir) end)
  if not ok then io_.stderr:write("ember: sweep: heatmap not drawn: ", tostring(err), "\n") end
  return ok
end

local function run_merge(args, io_)
  local dirs = flags.operands("sweep merge", args, M.usage, io_)
  if not dirs then return 0 end
  local out = table.remove(dirs, 1)
  if out == nil or #dirs == 0 then usage_error("sweep merge needs OUT and at least one shard directory") end
  local res = require("ember.sweep.merge").merge(out, dirs)
  io_.stderr:write(string.format("ember: sweep merge: %d shards, %d cells -> %s (%s)\n", #dirs, #res.cells, out,
    res.manifest.status))
  if res.manifest.status == "complete" then draw(out, io_) end
  return 0
end

local function run_compare(args, io_)
  local dirs = flags.operands("sweep compare", args, M.usage, io_)
  if not dirs then return 0 end
  if #dirs ~= 2 then usage_error("sweep compare needs two sweep directories, got %d", #dirs) end
  local store, merge = require("ember.sweep.store"), require("ember.sweep.merge")
  local a, b = store.read(dirs[1], { partial_ok = true }), store.read(dirs[2], { partial_ok = true })
  local res = merge.compare(a, b)
  io_.stdout:write(merge.format(res, a, b))
  return res.equal and 0 or 1
end

-- The argument list a shard process gets: this command's flags minus --jobs/--out/--progress.
local function shard_args(args)
  return flags.without(args, 2, M.FLAGS, { jobs = true, out = true, progress = true, ["no-plot"] = true })
end

-- main(args, argv, io_) -> exit code; args[1] is "sweep". Usage errors are raised (ember.cli.flags) for the
-- ember command to report with exit code 2.
function M.main(args, argv, io_)
  if args[2] == "merge" then return run_merge(args, io_) end
  if args[2] == "compare" then return run_compare(args, io_) end
  local o = flags.command({ name = "sweep", spec = M.FLAGS, usage = M.usage,
    required = { "model" } }, args, io_)
  if not o then return 0 end
  flags.pairs_or_prompts(o, "sweep")
  if o.out == nil then usage_error("sweep: --out is required") end
  if o.jobs and o.shard then usage_error("sweep: --jobs and --shard cannot be combined (--jobs makes the shards)") end
  local fs = require("ember.store.fs")
  if not fs.is_dir(fs.dirname(o.out)) then usage_error("--out: directory '%s' does not exist", fs.dirname(o.out)) end
  local unwritable = require("ember.run.outputs").writable { { flag = "--out", path = o.out, kind = "dir" } }
  if unwritable then usage_error("%s", unwritable) end
  if not fs.exists(o.model) then usage_error("--model: cannot open '%s'", o.model) end
  if o.pairs and not fs.exists(o.pairs) then usage_error("--pairs: cannot open '%s'", o.pairs) end

  if o.jobs then
    local res = require("ember.sweep.jobs").run { args = shard_args(args), out = o.out, jobs = o.jobs,
      progress = require("ember.sweep.progress").new { stream = io_.stderr, mode = o.progress, label = "sweep" },
      stderr = io_.stderr }
    if res.status == "complete" and not o["no-plot"] then draw(o.out, io_) end
    io_.stderr:write(string.format("ember: sweep: %d shards merged into %s\n", o.jobs, o.out))
    return 0
  end

  local model = flags.load_model(o)
  local progress = require("ember.sweep.progress").new { stream = io_.stderr, mode = o.progress,
    label = o.shard and string.format("sweep shard %d/%d", o.shard.index, o.shard.count) or "sweep" }
  local res = require("ember.sweep").run {
    model = model, tokenizer_path = o.tokenizer, clean = o.clean, corrupted = o.corrupted, pairs = o.pairs,
    metric = o.metric,
    stages = o.stages, layers = o.layers, positions = o.positions, decode_steps = o["decode-steps"],
    shard = o.shard, out = o.out,
    max_cells = o["max-cells"], progress = progress, argv = argv, checkpoint_seconds = o.checkpoint,
    reuse = not o["no-reuse"], batch = not o["no-batch"],
  }
  model:close()
  local st = res.stats
  io_.stderr:write(string.format("ember: sweep: %s: %d of %d cells (%d computed now, %d resumed) in %s\n",
    res.manifest.status, #res.cells, st.total, st.computed, st.resumed, o.out))
  if res.manifest.status == "complete" and not o.shard and not o["no-plot"] then draw(o.out, io_) end
  return 0
end

return M
