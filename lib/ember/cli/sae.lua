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
  tokenizer = { "tokenizer", "path", "FILE", "tokenizer.json (default: the tokenizer embedded in the GGUF)" },
  kernels = { "kernels", flags.kernels, "SET", "auto | reference | avx2 | avx512 (default auto)" },
  threads = { "threads", flags.uint_in(0, flags.MAX_THREADS), "N", "worker threads (default: the physical cores)" },
  json = { "json", "bool", nil, "print the report as one JSON object" },
  out = { "out", "path", "FILE.json", "also write the JSON report here (atomically)" },
  help = { "help", "bool", nil, "show this help" },
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

function M.usage()
  return flags.usage({
    "usage: ember sae eval --model M.gguf --sae DIR --prompts FILE.jsonl [options]",
    "       ember sae top --model M.gguf --sae DIR --prompts FILE.jsonl --out DIR [--features LIST] [options]",
    "       ember sae top merge OUT SHARD_DIR...",
    "",
    "eval options:",
  }, M.EVAL_FLAGS, {
    "",
    "top options:",
    flags.usage({}, M.TOP_FLAGS, {}),
    "eval: per prompt and overall, the KL and cross-entropy of the model with the SAE's reconstruction",
    "spliced in against the plain model (and with the SAE's stage zeroed: the CE score), L0, dead and dense",
    "features, and the variance of the activation the reconstruction explains (docs/sae.md).",
    "top: per feature the prompts where it fires most, with the tokens around its top position (JSON +",
    "safetensors; resumable and shardable like sweeps, scripts/slurm/sweep_array.sh --command 'sae top').",
  })
end

local function load_model(path, o)
  local ok, model = pcall(require("ember").load, { model = path, tokenizer = o.tokenizer, kernels = o.kernels,
    threads = o.threads })
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
  local o, pos = flags.parse(args, 3, flags.spec(M.EVAL_FLAGS))
  if o.help then io_.stdout:write(M.usage()); return 0 end
  if #pos > 0 then usage_error("sae eval: unexpected argument '%s'", pos[1]) end
  for _, k in ipairs({ "model", "sae", "prompts" }) do
    if o[k] == nil then usage_error("sae eval: --%s is required", k) end
  end
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
  local o, pos = flags.parse(args, 3, flags.spec(M.TOP_FLAGS))
  if o.help then io_.stdout:write(M.usage()); return 0 end
  if #pos > 0 then usage_error("sae top: unexpected argument '%s'", pos[1]) end
  for _, k in ipairs({ "model", "sae", "prompts", "out" }) do
    if o[k] == nil then usage_error("sae top: --%s is required", k) end
  end
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

-- main(args, argv, io_) -> exit code; args[1] is "sae". Experiments are refused first.
function M.main(args, argv, io_)
  flags.refuse_experiment_args("sae", args, 2)
  local sub = args[2]
  if sub == "eval" then return eval(args, io_) end
  if sub == "top" then return top(args, io_) end
  if sub == nil or sub == "--help" or sub == "-h" then
    io_.stdout:write(M.usage())
    return sub == nil and 2 or 0
  end
  usage_error("sae: unknown subcommand '%s' (eval, top)", tostring(sub))
end

return M
