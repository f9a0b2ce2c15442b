-- ember.cli.sae — the `ember sae eval|top|compare` subcommands: flags, loading the model(s), the
-- SAE and the prompts, and the reports (text on stdout, JSON with --json or --out). Must not hold
-- the measures (ember.sae.eval, ember.sae.top, ember.sae.compare do) nor run with an experiment.

local flags = require("ember.cli.flags")
local fs = require("ember.store.fs")
local json = require("ember.store.json")

local M = {}

local usage_error = flags.usage_error

local COMMON = {
  sae = { "sae", "path", "DIR", "the SAE: a SAELens directory, a Gemma Scope params.npz, a Llama Scope directory" },
  hook = { "sae-hook", "string", "NAME", "its TransformerLens hook (required for Gemma Scope; overrides the file's)" },
  prompts = { "prompts", "path", "FILE.jsonl", "the prompts, one {\"prompt\": ...} per line (required)" },
  tokenizer = flags.option("tokenizer"),
  kernels = flags.option("kernels"),
  threads = flags.option("threads"),
  json = { "json", "bool", nil, "print the report as one JSON object" },
  out = { "out", "path", "FILE.json", "also write the JSON report here (atomically)" },
  help = flags.option("help"),
}

M.EVAL_FLAGS = {
  { "model", "path", "FILE.gguf", "the model (required)" },
  COMMON.sae, COMMON.hook, COMMON.prompts,
  { "dense-threshold", flags.float_in(0, 1, true, false), "F", "a feature firing on more than this share of "
    .. "tokens is dense (default 0.1)" },
  COMMON.json, COMMON.out, COMMON.tokenizer, COMMON.kernels, COMMON.threads, COMMON.help,
}

local function progress_value(s)
  return require("ember.run.selectors").parse_choice(s, { "auto", "tty", "summary", "none" }, "progress mode")
end

local function features_value(s)
  local list, err = require("ember.run.selectors").parse_index_list(s, "feature")
  if not list then return nil, err end
  return list
end

M.TOP_FLAGS = {
  { "model", "path", "FILE.gguf", "the model (required)" },
  COMMON.sae, COMMON.hook, COMMON.prompts,
  { "features", features_value, "LIST", "the features: 0-based ids and ranges (3,17,100-120) or all (default)" },
  { "top", flags.uint_in(1, 1000), "N", "examples kept per feature (default 10)" },
  { "before", flags.uint_in(0, 256), "K", "tokens shown before an example's top token (default 8)" },
  { "after", flags.uint_in(0, 256), "K", "tokens shown after it (default 4)" },
  { "out", "path", "DIR", "write top.json, top.safetensors and the feature cards here; a rerun resumes (required)" },
  { "shard", "string", "I/N", "only prompts I, I+N, ... (0 <= I < N); merge the shards with `ember sae top merge`" },
  { "cards", flags.uint_in(0, 100000), "N", "feature cards (text and picture) written for the first N features "
    .. "(default 8)" },
  { "progress", progress_value, "MODE", "auto | tty | summary | none (default auto)" },
  COMMON.tokenizer, COMMON.kernels, COMMON.threads, COMMON.help,
}

M.COMPARE_FLAGS = {
  { "models", "path", "A.gguf B.gguf ...", "the models, the reference first (the others follow the flag)" },
  COMMON.sae, COMMON.hook, COMMON.prompts,
  { "out", "path", "DIR", "write report.json, table.txt and the histogram (correlations.svg/.png) here" },
  COMMON.json, COMMON.tokenizer, COMMON.kernels, COMMON.threads, COMMON.help,
}

function M.usage()
  return flags.usage({
    "usage: ember sae eval --model M.gguf --sae DIR --prompts FILE.jsonl [options]",
    "       ember sae top --model M.gguf --sae DIR --prompts FILE.jsonl --out DIR [--features LIST] [options]",
    "       ember sae top merge OUT SHARD_DIR...",
    "       ember sae compare --sae DIR --models A.gguf B.gguf ... --prompts FILE.jsonl [--out DIR] [options]",
    "",
    "eval options:",
  }, M.EVAL_FLAGS, {
    "",
    "top options:",
    flags.usage({}, M.TOP_FLAGS, {}),
    "compare options:",
    flags.usage({}, M.COMPARE_FLAGS, {}),
    "eval: per prompt and overall, the KL and cross-entropy of the model with the SAE's reconstruction",
    "spliced in against the plain model (and with the SAE's stage zeroed: the CE score), L0, dead and dense",
    "features, and the variance of the activation the reconstruction explains (docs/sae.md).",
    "top: per feature the prompts where it fires most, with the tokens around its top position (JSON +",
    "safetensors; resumable and shardable like sweeps, scripts/slurm/sweep_array.sh --command 'sae top').",
    "compare: the same tokens through each model; per feature the Pearson correlation of its activations",
    "with the first model's and its firing-rate shift, the share of features above 0.9/0.7/0.5 and the",
    "SAE's spliced KL per model: which features survive quantization (docs/sae.md explains the report).",
  })
end

local function load_model(path, o)
  local ok, model = pcall(flags.load_model, o, { model = path })
  if not ok then usage_error("--model: %s", tostring(model)) end
  return model
end

local function load_sae(o, model)
  local ok, sae = pcall(require("ember.sae").load, o.sae, { hook = o["sae-hook"], model = model })
  if not ok then usage_error("--sae: %s", tostring(sae)) end
  return sae
end

-- The prompts of --prompts as token ids (the model's tokenizer, BOS as the model adds it).
local function read_prompts(o, model)
  local okp, list, digest = pcall(require("ember.analysis.extract").read_prompts, o.prompts, "--prompts")
  if not okp then usage_error("%s", list) end
  if model.tokenizer == nil then
    usage_error("--prompts: the model has no tokenizer: give one with --tokenizer FILE")
  end
  local out = {}
  for i, p in ipairs(list) do out[i] = { text = p.prompt, ids = model:tokenize(p.prompt), line = p.line } end
  return out, digest
end

local function num(x)
  if x ~= x then return json.null end -- NaN (no predicted position, ...)
  return x
end

local function report_json(res, o, digest)
  local per = json.array()
  for i, r in ipairs(res.prompts) do
    per[i] = json.ordered({ "index", "tokens", "kl", "kl_max", "ce_clean", "ce_spliced", "ce_zero", "ce_delta",
      "ce_score", "l0", "fve", "mse", "cosine" }, {
      index = i - 1, tokens = r.tokens, kl = num(r.kl), kl_max = num(r.kl_max), ce_clean = num(r.ce_clean),
      ce_spliced = num(r.ce_spliced), ce_zero = num(r.ce_zero), ce_delta = num(r.ce_delta), ce_score = num(r.ce_score),
      l0 = num(r.l0), fve = num(r.fve), mse = num(r.mse), cosine = num(r.cosine) })
  end
  local ov = res.overall
  local f = res.features
  return json.ordered({ "command", "model", "sae", "prompts", "overall", "features", "per_prompt" }, {
    command = "sae eval",
    model = o.model,
    sae = json.ordered({ "path", "hook", "architecture", "d_in", "d_sae" }, { path = o.sae, hook = res.hook,
      architecture = res.architecture, d_in = res.d_in, d_sae = f.d_sae }),
    prompts = json.ordered({ "path", "sha256", "count" }, { path = o.prompts, sha256 = digest, count = ov.prompts }),
    overall = json.ordered({ "tokens", "kl", "ce_clean", "ce_spliced", "ce_zero", "ce_delta", "ce_score", "l0",
      "fve" }, { tokens = ov.tokens, kl = num(ov.kl), ce_clean = num(ov.ce_clean), ce_spliced = num(ov.ce_spliced),
      ce_zero = num(ov.ce_zero), ce_delta = num(ov.ce_delta), ce_score = num(ov.ce_score), l0 = num(ov.l0),
      fve = num(ov.fve) }),
    features = json.ordered({ "dead", "dense", "dense_threshold" }, { dead = f.dead, dense = f.dense,
      dense_threshold = f.dense_threshold }),
    per_prompt = per,
  })
end

local function eval(args, io_)
  local o = flags.command({ name = "sae eval", first = 3, spec = flags.spec(M.EVAL_FLAGS), usage = M.usage,
    required = { "model", "sae", "prompts" } }, args, io_)
  if not o then return 0 end
  local model = load_model(o.model, o)
  local sae = load_sae(o, model)
  local prompts, digest = read_prompts(o, model)
  local res = require("ember.sae.eval").run { model = model, sae = sae, prompts = prompts,
    dense_threshold = o["dense-threshold"] }
  res.hook, res.architecture, res.d_in = sae.hook, sae.architecture, sae.d_in
  local doc = report_json(res, o, digest)
  if o.out then
    local ok, err = pcall(fs.write_atomic, o.out, json.encode(doc, { indent = "  " }), "--out")
    if not ok then usage_error("%s", err) end
  end
  if o.json then
    io_.stdout:write(json.encode(doc, { indent = "  " }))
    return 0
  end
  local w = io_.stdout
  w:write(string.format("sae %s (%s, %s, d_sae %d) on %s, %d prompts\n", o.sae, sae.hook, sae.architecture,
    sae.d_sae, o.model, #prompts))
  w:write("prompt  tokens        KL   CE plain  CE spliced   CE diff  CE score     L0      FVE\n")
  local function line(label, r)
    w:write(string.format("%-6s %7d %9.5f %10.4f %11.4f %9.4f %9.4f %6.1f %8.4f\n", label, r.tokens, r.kl,
      r.ce_clean, r.ce_spliced, r.ce_delta, r.ce_score, r.l0, r.fve))
  end
  for i, r in ipairs(res.prompts) do line(tostring(i - 1), r) end
  line("all", res.overall)
  w:write(string.format("features: %d dead, %d dense (firing on more than %.3g of the tokens), of %d\n",
    res.features.dead, res.features.dense, res.features.dense_threshold, res.features.d_sae))
  return 0
end

local function write_cards(dir, res, o, sae, io_)
  local card = require("ember.sae.card")
  local cdir = fs.join(dir, "cards")
  local ok, err = fs.mkdir_p(cdir)
  if not ok then usage_error("--out: %s", err) end
  local n = math.min(o.cards or 8, #res.features)
  for k = 1, n do
    local f = res.features[k]
    local lines = card.text(f, { tokens = res.tokens, hook = sae.hook, sae = o.sae })
    local base = "feature-" .. f.feature
    fs.write_atomic(fs.join(cdir, base .. ".txt"), table.concat(lines, "\n") .. "\n", "sae top")
    io_.stdout:write(table.concat(lines, "\n"), "\n")
    if #f.examples > 0 then
      local pok, perr = pcall(card.picture, f,
        { dir = cdir, base = base, before = o.before or 8, after = o.after or 4 })
      if not pok then
        io_.stderr:write("ember: sae top: no picture for feature ", f.feature, ": ", tostring(perr), "\n")
      end
    end
  end
end

local function top_merge(args, io_)
  local out, dirs = args[4], { table.unpack(args, 5) }
  if out == nil or #dirs == 0 then usage_error("sae top merge: expected OUT SHARD_DIR...") end
  local ok, doc = pcall(require("ember.sae.top").merge, out, dirs)
  if not ok then error(doc, 0) end
  io_.stdout:write(string.format("sae top merge: %d shards into %s: %s, %d of %d prompts\n", #dirs, out, doc.status,
    #doc.prompts_done, doc.settings.prompts.count))
  return 0
end

local function top(args, io_)
  if args[3] == "merge" then return top_merge(args, io_) end
  local o = flags.command({ name = "sae top", first = 3, spec = flags.spec(M.TOP_FLAGS), usage = M.usage,
    required = { "model", "sae", "prompts", "out" } }, args, io_)
  if not o then return 0 end
  if o.shard then
    local sh, err = require("ember.sweep").parse_shard(o.shard)
    if not sh then usage_error("--shard: %s", err) end
  end
  local model = load_model(o.model, o)
  local sae = load_sae(o, model)
  local prompts, digest = read_prompts(o, model)
  local features = o.features
  if features == "all" then features = nil end
  if features then
    for _, f in ipairs(features) do
      if f >= sae.d_sae then usage_error("--features: feature %d is not one of the SAE's (0-%d)", f, sae.d_sae - 1) end
    end
  end
  local res = require("ember.sae.top").run { model = model, sae = sae, prompts = prompts, features = features,
    top = o.top, before = o.before, after = o.after, shard = o.shard, out = o.out,
    progress = require("ember.sweep.progress").new { stream = io_.stderr, mode = o.progress, label = "sae top",
      unit = "prompts" },
    model_sha256 = (model:sha256()), sae_sha256 = require("ember").sha256_file(sae.files.weights),
    prompts_sha256 = digest }
  if res.status == "complete" and not o.shard then write_cards(o.out, res, o, sae, io_) end
  return 0
end

local function fmt(x, f) return x == x and string.format(f, x) or "-" end

local function compare_doc(res, o, digest)
  local cmp = require("ember.sae.compare")
  local models = json.array()
  for m, e in ipairs(res.models) do
    local ev = e.eval
    local entry = { path = e.path, weights = e.info.dtype_summary, reference = m == 1,
      eval = json.ordered({ "kl", "ce_clean", "ce_spliced", "ce_delta", "fve", "l0" }, { kl = num(ev.kl),
        ce_clean = num(ev.ce_clean), ce_spliced = num(ev.ce_spliced), ce_delta = num(ev.ce_delta), fve = num(ev.fve),
        l0 = num(ev.l0) }),
      dead = e.features.dead }
    local keys = { "path", "weights", "reference", "eval", "dead" }
    if e.summary then
      local sm = e.summary
      local shares = {}
      for k, t in ipairs(cmp.THRESHOLDS) do shares[string.format("%.1f", t)] = num(sm.share[k]) end
      local corr, shift = json.array(), json.array()
      for i = 1, #sm.correlation do corr[i], shift[i] = num(sm.correlation[i]), sm.fire_shift[i] end
      entry.defined, entry.median_correlation, entry.mean_abs_fire_shift = sm.defined, num(sm.median),
        sm.mean_abs_fire_shift
      entry.share_above = json.ordered({ "0.9", "0.7", "0.5" }, shares)
      entry.correlation, entry.fire_shift = corr, shift
      for _, k in ipairs({ "defined", "median_correlation", "share_above", "mean_abs_fire_shift", "correlation",
        "fire_shift" }) do keys[#keys + 1] = k end
    end
    models[m] = json.ordered(keys, entry)
  end
  return json.ordered({ "command", "sae", "prompts", "tokens", "models" }, {
    command = "sae compare",
    sae = json.ordered({ "path", "hook", "architecture", "d_sae" }, { path = o.sae, hook = res.hook,
      architecture = res.architecture, d_sae = res.d_sae }),
    prompts = json.ordered({ "path", "sha256", "count" }, { path = o.prompts, sha256 = digest, count = res.count }),
    tokens = res.tokens, models = models })
end

local function compare_table(res)
  local cmp = require("ember.sae.compare")
  local lines = { string.format("%-28s %-20s %9s %9s %8s %6s %8s %6s %6s %6s %8s", "model", "weights", "KL",
    "CE diff", "FVE", "alive", "median r", ">=0.9", ">=0.7", ">=0.5", "|fire d|") }
  for m, e in ipairs(res.models) do
    local ev, sm = e.eval, e.summary
    local name = e.path:match("[^/]+$") or e.path
    local tail = m == 1 and string.format(" %6d %8s %6s %6s %6s %8s", e.features.d_sae - e.features.dead,
      "(ref)", "", "", "", "") or string.format(" %6d %8s %6s %6s %6s %8s", sm.defined, fmt(sm.median, "%.4f"),
      fmt(sm.share[1], "%.3f"), fmt(sm.share[2], "%.3f"), fmt(sm.share[3], "%.3f"),
      fmt(sm.mean_abs_fire_shift, "%.4f"))
    lines[#lines + 1] = string.format("%-28s %-20s %9s %9s %8s", name:sub(1, 28),
      tostring(e.info.dtype_summary):sub(1, 20), fmt(ev.kl, "%.5f"), fmt(ev.ce_delta, "%.4f"), fmt(ev.fve, "%.4f"))
      .. tail
  end
  lines[#lines + 1] = string.format("alive: features with a defined correlation (active and varying under both "
    .. "models); shares are of those; thresholds %s", table.concat(cmp.THRESHOLDS, "/"))
  return lines
end

local function compare_plot(res, dir)
  local cmp = require("ember.sae.compare")
  local bins, xtics, series = 20, { "<0" }, {}
  for b = 1, bins do xtics[b + 1] = string.format("%.2f", (b - 1) / bins) end
  for m = 2, #res.models do
    local e = res.models[m]
    series[#series + 1] = { name = e.path:match("[^/]+$") or e.path, values = cmp.histogram(e.summary.correlation,
      bins) }
  end
  return require("ember.analysis.plot").lines { dir = dir, base = "correlations",
    title = "per-feature correlation with " .. (res.models[1].path:match("[^/]+$") or res.models[1].path),
    xlabel = "Pearson r of the feature's activations (bin start)", ylabel = "features", xtics = xtics,
    series = series }
end

local function compare(args, io_)
  local o, pos = flags.command({ name = "sae compare", first = 3, spec = flags.spec(M.COMPARE_FLAGS), usage = M.usage,
    positionals = true, required = { "models", "sae", "prompts" } }, args, io_)
  if not o then return 0 end
  local paths = { o.models, table.unpack(pos) }
  if #paths < 2 then usage_error("--models: give at least two models (the first is the reference)") end
  for _, p in ipairs(paths) do if not fs.exists(p) then usage_error("--models: cannot open '%s'", p) end end
  local ok, sae = pcall(require("ember.sae").load, o.sae, { hook = o["sae-hook"], kernels = o.kernels,
    threads = o.threads })
  if not ok then usage_error("--sae: %s", tostring(sae)) end
  local okp, list, digest = pcall(require("ember.analysis.extract").read_prompts, o.prompts, "--prompts")
  if not okp then usage_error("%s", list) end
  local prompts = {}
  for i, p in ipairs(list) do prompts[i] = { text = p.prompt } end
  local res = require("ember.sae.compare").run { models = paths, sae = sae, prompts = prompts,
    load = function(path) return load_model(path, o) end,
    on_model = function(m, path) io_.stderr:write(string.format("sae compare: model %d/%d %s done\n", m, #paths,
      path)) end }
  res.hook, res.architecture, res.d_sae, res.count = sae.hook, sae.architecture, sae.d_sae, #prompts
  local doc = compare_doc(res, o, digest)
  local lines = compare_table(res)
  if o.out then
    local mok, merr = fs.mkdir_p(o.out)
    if not mok then usage_error("--out: %s", merr) end
    fs.write_atomic(fs.join(o.out, "report.json"), json.encode(doc, { indent = "  " }), "--out")
    fs.write_atomic(fs.join(o.out, "table.txt"), table.concat(lines, "\n") .. "\n", "--out")
    if require("ember.analysis.plot").gnuplot() then compare_plot(res, o.out) end
  end
  if o.json then
    io_.stdout:write(json.encode(doc, { indent = "  " }))
  else
    io_.stdout:write(string.format("sae %s (%s) on %d prompts, %d tokens; reference %s\n", o.sae, sae.hook,
      #prompts, res.tokens, paths[1]))
    io_.stdout:write(table.concat(lines, "\n"), "\n")
  end
  return 0
end

-- main(args, argv, io_) -> exit code; args[1] is "sae" (experiments were refused before: ember.cli).
function M.main(args, argv, io_)
  local sub = args[2]
  if sub == "eval" then return eval(args, io_) end
  if sub == "top" then return top(args, io_) end
  if sub == "compare" then return compare(args, io_) end
  if sub == nil or sub == "--help" or sub == "-h" then
    io_.stdout:write(M.usage())
    return sub == nil and 2 or 0
  end
  usage_error("sae: unknown subcommand '%s' (eval, top, compare)", tostring(sub))
end

return M
