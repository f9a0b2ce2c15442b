-- ember.cli — the `ember` command: generate text with optional experiments, capture, patch, and
-- the compare-artifacts subcommand. Generated text goes to stdout, notices and errors to stderr.
-- Must not contain experiment logic: it parses, validates, and hands over to ember.run/compare.
--
-- Exit codes: 0 success; 1 the run or comparison failed (hook failure, unreadable artifact,
-- --require not met); 2 usage error (unknown/malformed flag, bad value, out-of-range layer).

local flags = require("ember.cli.flags")
local selectors = require("ember.run.selectors")

local M = {}

-- ---- flags (the grammar is ember.cli.flags'; the lists are this command's) ---------------------------

local function zero_value(s) return selectors.parse_layer_stage(s, "zero") end
local function patch_value(s) return selectors.parse_layer_stage(s, "patch") end
local positive = flags.positive

local function kv_cache_value(v) return selectors.parse_choice(v, { "f32", "f16", "bf16" }, "KV cache type") end

M.FLAGS = {
  { "arch", "string", "ARCH", "refuse the model unless its family is ARCH (llama, qwen3, qwen2, gemma4, gpt2)" },
  { "model", "path", "FILE.gguf", "the model (required)" },
  { "tokenizer", "path", "FILE", "tokenizer.json (default: the tokenizer embedded in the GGUF)" },
  { "prompt", "string", "TEXT", "the prompt (required)" },
  { "max-tokens", flags.uint_in(0, flags.MAX_CONTEXT, "the largest session"), "N", "tokens to generate (default 16)" },
  { "temperature", flags.float_in(0, nil), "T", "0 = greedy (default 0)" },
  { "top-k", flags.uint_in(0, flags.MAX_TOP_K), "K", "sample among the K most likely tokens (0 = off)" },
  { "top-p", flags.float_in(0, 1, true, false), "P", "nucleus sampling threshold (1 = off)" },
  { "seed", "uint", "N", "sampling seed (default 0)" },
  { "context", flags.uint_in(1, flags.MAX_CONTEXT, "the largest session"), "N",
    "session positions (default: prompt + max-tokens, within the model's context_length; N may go beyond it)" },
  { "threads", flags.uint_in(0, flags.MAX_THREADS), "N", "worker threads (default: the physical cores)" },
  { "kernels", flags.kernels, "SET", "auto | reference | avx2 | avx512 (default auto)" },
  { "kv-cache", kv_cache_value, "TYPE", "KV cache type: f32 (default, exact) | f16 | bf16 (half the memory)" },
  { "experiment", "path", "FILE.lua", "attach the experiment this file returns" },
  { "experiment-args", "string", "STR", "argument string given to the experiment's factory" },
  { "activation-stats", "path", "FILE.json", "observe every hook; write statistics JSON (SPEC §5)" },
  { "zero-layer-output", zero_value, "L:STAGE", "zero layer L's attention|mlp output or finished layer" },
  { "steer", selectors.parse_steer, "L:STAGE:FILE[:SCALE]",
    "add a vector (.npy, .safetensors[#NAME], ARTIFACT_DIR#RECORD; @ROW picks a row) times SCALE at layers L, "
      .. "stage STAGE (repeatable)",
    many = true },
  { "sae-steer", selectors.parse_sae_steer, "DIR:FEATURE:SCALE",
    "add an SAE feature's decoder direction times SCALE where the SAE writes, in prefill and every decode "
      .. "(repeatable; docs/sae.md)", many = true },
  { "sae-hook", "string", "NAME", "the TransformerLens hook of --sae-steer's SAEs (Gemma Scope names none)" },
  { "control-vector", selectors.parse_control_vector, "FILE.gguf[:SCALE]",
    "add a llama.cpp control vector (direction.N at after_layer of layer N; repeatable: vectors sum)", many = true },
  { "control-vector-layers", function(v) return require("ember.run.control_vector").parse_range(v) end, "A-B",
    "apply control vectors only at layers A..B, inclusive (default 1 to the last layer, as llama.cpp)" },
  { "capture-activations", "path", "DIR", "capture selected tensors into a new artifact directory" },
  { "capture-layers", selectors.parse_index_list, "LIST", "layers to capture: all | 0,2,4-6 (per-layer stages only)" },
  { "capture-stages", selectors.parse_stage_list, "LIST",
    "stages to capture (and to --activation-stats): all | before_layer,attention_pattern,... "
      .. "(default: the residual stream)" },
  { "capture-phase", selectors.parse_phase, "PHASE", "prefill | decode | all (default all)" },
  { "capture-positions", selectors.parse_index_list, "LIST", "decode positions to capture: all | 5,7-9" },
  { "capture-max-records", positive, "N", "stop capturing after N records" },
  { "capture-omit-prompt", "bool", nil, "store only the prompt's sha256, not its text" },
  { "activation-patch", "path", "DIR", "patch activations from this captured artifact" },
  { "patch-target", patch_value, "L:STAGE", "the layer and stage to patch (e.g. 4:after_mlp)" },
  { "patch-positions", selectors.parse_index_list, "LIST",
    "patch only these positions: all | 0,3-5 (prefill rows, decode positions)" },
  { "extract-hidden", function(v) return selectors.parse_index_list(v, "layer") end, "LAYERS",
    "extract the residual stream after these layers (all | 0,2,4-6) for every prompt token (docs/extraction.md)" },
  { "extract-out", "path", "FILE.safetensors", "where --extract-hidden writes (a JSON sidecar FILE.json beside it)" },
  { "prompts", "path", "FILE.jsonl", "--extract-hidden over a batch: one {\"prompt\": ..., \"label\": ...} per line" },
  { "trace", "path", "FILE.jsonl", "write a structured trace: one JSON line per executed op (docs/inspection.md)" },
  { "trace-layers", selectors.parse_index_list, "LIST",
    "trace only these layers' ops: all | 0,2,4-6 (model-level ops stay)" },
  { "trace-ops", function(v)
      local list = {}
      for name in v:gmatch("[^,%s]+") do list[#list + 1] = name end
      if #list == 0 then return nil, "expected a list of op names like attn_q,ffn_down" end
      local _, err = require("ember.model.trace").check_filter({ ops = list })
      if err then return nil, err end
      return list
    end, "LIST", "trace only these ops: attn_q,ffn_down,... (names: docs/inspection.md)" },
  { "dump-layers", "path", "DIR", "dump every layer's output of every evaluation into a new directory" },
  { "dump-logits", "path", "FILE", "dump every evaluation's logits (safetensors, with a FILE.json sidecar)" },
  { "run-manifest", "path", "FILE.json",
    "write the run manifest here (default: DIR/run.json of a capture, or beside --activation-stats)" },
  { "verify-model", "bool", nil, "hash the model file for the manifest even when the digest cache knows it" },
  { "verbose", "bool", nil, "say on stderr what the run uses (model, kernel set, threads and why)" },
  { "help", "bool", nil, "show this help" },
  { "version", "bool", nil, "show the version" },
}
local FLAG = flags.spec(M.FLAGS)

-- `ember benchmark`
M.BENCH_FLAGS_LIST = {
  { "model", "path", "FILE.gguf", "the model (required)" },
  { "prompt-tokens", positive, "N", "prompt length in tokens (default 52)" },
  { "gen-tokens", positive, "N", "tokens generated per run (default 32)" },
  { "threads", flags.uint_in(1, flags.MAX_THREADS), "N", "worker threads (default: the physical cores)" },
  { "kernels", flags.kernels, "SET", "auto | reference | avx2 | avx512 (default auto)" },
  { "kv-cache", kv_cache_value, "TYPE", "KV cache type: f32 (default, exact) | f16 | bf16 (half the memory)" },
  { "repeat", positive, "R", "measured runs; medians are reported (default 5)" },
  { "warmup", "uint", "W", "unreported runs first (default 1)" },
  { "json", "bool", nil, "print one JSON object" },
  { "membw", "bool", nil, "also measure read bandwidth (bench-engine --membw) and the decode ceiling" },
  { "hooks-ab", "bool", nil, "interleave no experiment (A) with a name-only experiment (B); report both" },
  { "trace-ab", "bool", nil, "interleave untraced runs (A) with runs writing a --trace file (B); report both" },
  { "provenance-ab", "bool", nil, "time to first token: plain runs (A) against runs writing a manifest (B)" },
  { "help", "bool", nil, "show this help" },
}
M.BENCH_FLAGS = flags.spec(M.BENCH_FLAGS_LIST)

M.COMPARE_FLAGS = flags.spec({ { "json", "bool" }, { "records", "bool" }, { "require", selectors.parse_class } })

local usage_error = flags.usage_error

function M.usage()
  return flags.usage({
    "usage: ember --model FILE.gguf --prompt TEXT [options]",
    "       ember compare-artifacts DIR_A DIR_B [--records] [--json] [--require CLASS]",
    "       ember benchmark --model FILE.gguf [options]   (ember benchmark --help)",
    "       ember sweep --model FILE.gguf --clean TEXT --corrupted TEXT --out DIR   (ember sweep --help)",
    "       ember compare-models A.gguf B.gguf --prompt TEXT --out DIR   (ember compare-models --help)",
    "       ember --model FILE.gguf --prompts FILE.jsonl --extract-hidden LAYERS --extract-out FILE.safetensors",
    "       ember attention --model FILE.gguf --prompt TEXT --layer L [--head H]   (ember attention --help)",
    "       ember control-vector --model FILE.gguf --positive P.jsonl --negative N.jsonl --out CV.gguf",
    "       ember probe train|eval ...   (ember probe --help)",
    "       ember sae eval|top|compare ...   (ember sae --help)",
    "       ember demo [--model FILE.gguf]   (ember demo --help)",
    "       ember interactive [--model FILE.gguf] [options]   (ember interactive --help)",
    "",
    "options:",
  }, M.FLAGS, {
    "",
    "compare-artifacts: aligns records on (stage, layer, phase, start_position) and prints a summary",
    "  (counts, the first differing records, the largest differences per stage and layer) and a class:",
    "  " .. table.concat(selectors.CLASSES, " > "),
    "  (two sweep directories are compared cell by cell, with the same classes)",
    "  --records         every aligned record instead of the summary",
    "  --json            machine-readable result",
    "  --require CLASS   exit 0 only for CLASS or a stricter class",
    "",
    "Generated text goes to stdout, notices to stderr. Exit: 0 ok, 1 failure, 2 usage error.",
    "A run manifest goes into the capture directory (DIR/run.json), else beside the --activation-stats file",
    "(stats.json -> stats.run.json), else where --run-manifest says; otherwise none is written.",
  })
end

function M.bench_usage()
  return flags.usage({ "usage: ember benchmark --model FILE.gguf [options]", "", "options:" }, M.BENCH_FLAGS_LIST,
    { "", "Prefill and decode tok/s are medians of the repeats (greedy, end-of-sequence ignored)." })
end

-- ---- subcommands -----------------------------------------------------------------------------------

-- Inspection surfaces whose values have no defined meaning under an active experiment (SPEC §7).
local REFUSED_WITH_EXPERIMENTS = { demo = true, interactive = true, benchmark = true, probe = true }
local EXPERIMENT_FLAGS = flags.EXPERIMENT_FLAGS
local refuse_experiments = flags.refuse_experiments

local function mib(kib) return kib and kib / 1024 or nil end

local function run_benchmark(args, io_)
  refuse_experiments("benchmark", flags.present(args, 2, EXPERIMENT_FLAGS))
  local o, pos = flags.parse(args, 2, M.BENCH_FLAGS)
  if o.help then io_.stdout:write(M.bench_usage()); return 0 end
  if #pos > 0 then usage_error("benchmark: unexpected argument '%s'", pos[1]) end
  if o["hooks-ab"] and o["trace-ab"] then usage_error("benchmark: --hooks-ab and --trace-ab are two runs; give one") end
  if o.model == nil then usage_error("benchmark: --model FILE.gguf is required") end
  local bench = require("ember.run.benchmark")
  if o["provenance-ab"] then
    local res = bench.provenance_ab({ model = o.model, kernels = o.kernels, threads = o.threads }, {
      prompt_tokens = o["prompt-tokens"], gen_tokens = o["gen-tokens"], ["repeat"] = o["repeat"], warmup = o.warmup })
    if o.json then
      io_.stdout:write(require("ember.store.json").encode(res, { indent = "  " }))
    else
      io_.stdout:write(bench.format_provenance_ab(res))
    end
    return 0
  end
  -- the probe is looked for before the model loads: a long run must not end in a missing tool
  local probe
  if o.membw then
    local why
    probe, why = bench.bench_engine_path()
    if not probe then
      usage_error("--membw: the bandwidth probe '%s' was not found (build it, or set EMBER_BENCH_ENGINE)", why)
    end
  end
  local ok, model = pcall(require("ember").load, { model = o.model, kernels = o.kernels, threads = o.threads,
    kv_cache = o["kv-cache"] })
  if not ok then error(tostring(model), 0) end
  local opts = { prompt_tokens = o["prompt-tokens"], gen_tokens = o["gen-tokens"], ["repeat"] = o["repeat"],
    warmup = o.warmup }
  local res, ab
  if o["hooks-ab"] or o["trace-ab"] then
    ab = o["trace-ab"] and bench.trace_ab(model, opts) or bench.hooks_ab(model, opts)
    res = ab
    res.prefill_tok_s, res.decode_tok_s = ab.a.prefill_tok_s, ab.a.decode_tok_s
  else
    res = bench.run(model, opts)
  end
  local rss = mib(bench.peak_rss_kib()) -- before the probe (a separate process anyway)
  model:close()
  local gbs, ceiling, paired
  if o.membw then -- one bench-engine run: the best-of-10 probe and the paired measurement
    paired, gbs = bench.paired(o.model, { threads = res.threads, kernels = res.kernels, kv_cache = res.kv_cache,
      prompt_tokens = res.prompt_tokens, gen_tokens = res.gen_tokens, ["repeat"] = res["repeat"] }, probe)
    ceiling = gbs * 1e9 / res.model.weight_bytes_per_token
  end

  if o.json then
    local json = require("ember.store.json")
    local function side(x)
      return json.ordered({ "prefill_tok_s", "decode_tok_s", "prefill_runs", "decode_runs" }, {
        prefill_tok_s = x.prefill_tok_s, decode_tok_s = x.decode_tok_s,
        prefill_runs = json.array(x.prefill or x.a.prefill), decode_runs = json.array(x.decode or x.a.decode) })
    end
    local m = res.model
    local doc = json.ordered({ "model", "kernels", "kv_cache", "threads", "prompt_tokens", "gen_tokens", "repeat",
      "warmup",
      "prefill_tok_s", "decode_tok_s", "prefill_runs", "decode_runs", "peak_rss_mib", "membw_gbs",
      "decode_ceiling_tok_s", "paired", "hooks_ab", "trace_ab" }, {
      model = json.ordered({ "path", "family", "name", "dtype", "n_layers", "hidden_size", "n_vocab",
        "weight_bytes_per_token" }, {
        path = m.path, family = m.family, name = m.name, dtype = m.dtype, n_layers = m.n_layers,
        hidden_size = m.hidden_size, n_vocab = m.n_vocab, weight_bytes_per_token = m.weight_bytes_per_token }),
      kernels = res.kernels, kv_cache = res.kv_cache, threads = res.threads, prompt_tokens = res.prompt_tokens,
      gen_tokens = res.gen_tokens, ["repeat"] = res["repeat"], warmup = res.warmup, prefill_tok_s = res.prefill_tok_s,
      decode_tok_s = res.decode_tok_s, prefill_runs = json.array(ab and ab.a.prefill or res.prefill),
      decode_runs = json.array(ab and ab.a.decode or res.decode), peak_rss_mib = rss, membw_gbs = gbs,
      decode_ceiling_tok_s = ceiling,
      paired = paired and json.ordered({ "pairs", "share", "decode_tok_s", "membw_gbs" }, paired) or nil,
      hooks_ab = ab and not o["trace-ab"] and json.ordered({ "no_experiment", "name_only", "prefill_ratio",
        "decode_ratio" }, { no_experiment = side(ab.a), name_only = side(ab.b), prefill_ratio = ab.prefill_ratio,
        decode_ratio = ab.decode_ratio }) or nil,
      trace_ab = ab and o["trace-ab"] and json.ordered({ "untraced", "traced", "prefill_ratio", "decode_ratio" }, {
        untraced = side(ab.a), traced = side(ab.b), prefill_ratio = ab.prefill_ratio,
        decode_ratio = ab.decode_ratio }) or nil,
    })
    io_.stdout:write(json.encode(doc, { indent = "  " }))
    return 0
  end
  local m, w = res.model, io_.stdout
  w:write(string.format("model      %s (%s, %s)\n", m.path, m.family, m.dtype))
  w:write(string.format("kernels    %s, %d threads, %s KV cache\n", res.kernels, res.threads, res.kv_cache))
  if ab then
    w:write(string.format(o["trace-ab"] and "trace A/B  %d interleaved pairs: A untraced, B traced into a file\n"
      or "hooks A/B  %d interleaved pairs: A no experiment, B an experiment with only a name\n", res["repeat"]))
    w:write(string.format("prefill    A %.1f tok/s, B %.1f tok/s, B/A %.3f (medians, %d-token prompt)\n",
      ab.a.prefill_tok_s, ab.b.prefill_tok_s, ab.prefill_ratio, res.prompt_tokens))
    w:write(string.format("decode     A %.2f tok/s, B %.2f tok/s, B/A %.3f (medians, %d tokens)\n",
      ab.a.decode_tok_s, ab.b.decode_tok_s, ab.decode_ratio, res.gen_tokens))
  else
    w:write(string.format("prefill    %.1f tok/s median of %d, %d-token prompt\n", res.prefill_tok_s, res["repeat"],
      res.prompt_tokens))
    w:write(string.format("decode     %.2f tok/s median of %d, %d tokens\n", res.decode_tok_s, res["repeat"],
      res.gen_tokens))
  end
  if rss then w:write(string.format("peak RSS   %.1f MiB\n", rss)) end
  w:write(string.format("weights    %.1f MB read per decoded token\n", m.weight_bytes_per_token / 1e6))
  if gbs then
    w:write(string.format("bandwidth  %.1f GB/s -> decode ceiling %.1f tok/s (decode reaches %.0f%%)\n", gbs, ceiling,
      100 * res.decode_tok_s / ceiling))
  end
  if paired then
    w:write(string.format("paired     decode reaches %.0f%% of the ceiling: median over %d pairs of one decoded "
      .. "token and\n"
      .. "           one probe pass right after it (bench-engine; medians: decode %.1f tok/s, bandwidth %.1f GB/s)\n",
      100 * paired.share, paired.pairs, paired.decode_tok_s, paired.membw_gbs))
  end
  return 0
end

local function run_compare(args, io_)
  local spec = M.COMPARE_FLAGS
  local opts, pos = flags.parse(args, 2, spec)
  if #pos ~= 2 then usage_error("compare-artifacts needs two artifact directories, got %d", #pos) end
  local compare = require("ember.analysis.compare")
  -- two sweep artifacts are compared cell by cell, with the same classes, --json and --require
  local sweeps = require("ember.sweep.compare")
  local sa, sb = sweeps.is_sweep(pos[1]), sweeps.is_sweep(pos[2])
  if sa ~= sb then
    error(string.format("compare-artifacts: '%s' is %s and '%s' is %s; compare two sweeps or two activation "
      .. "artifacts", pos[1], sa and "a sweep" or "not a sweep", pos[2], sb and "a sweep" or "not a sweep"), 0)
  end
  local kind = sa and sweeps or compare
  local res = kind.compare_dirs(pos[1], pos[2])
  if opts.json then
    io_.stdout:write(kind.to_json(res))
  else
    -- activation artifacts: a summary, or every record with --records
    io_.stdout:write(kind.format_text(res, { records = opts.records }))
  end
  if opts.require and not compare.at_least(res.class, opts.require) then
    io_.stderr:write(string.format("ember: compare-artifacts: class %s does not meet --require %s\n",
      res.class, opts.require))
    return 1
  end
  return 0
end

local function check_combinations(o)
  local interventions = {}
  for _, k in ipairs({ "zero-layer-output", "activation-patch", "experiment" }) do
    if o[k] ~= nil then interventions[#interventions + 1] = "--" .. k end
  end
  -- --steer, --sae-steer and --control-vector are additions of one kind (one experiment): they go
  -- together
  local adds = {}
  for _, k in ipairs({ "steer", "sae-steer", "control-vector" }) do
    if o[k] ~= nil then adds[#adds + 1] = "--" .. k end
  end
  if #adds > 0 then interventions[#interventions + 1] = table.concat(adds, "/") end
  if o["sae-hook"] ~= nil and o["sae-steer"] == nil then
    usage_error("--sae-hook needs --sae-steer DIR:FEATURE:SCALE")
  end
  if #interventions > 1 then
    usage_error("%s cannot be combined: one intervention per run (capture and --activation-stats may be added to any)",
      table.concat(interventions, " and "))
  end
  if o["experiment-args"] ~= nil and o.experiment == nil then usage_error("--experiment-args needs --experiment") end
  if o["control-vector-layers"] ~= nil and o["control-vector"] == nil then
    usage_error("--control-vector-layers needs --control-vector FILE.gguf")
  end
  if (o["activation-patch"] == nil) ~= (o["patch-target"] == nil) then
    usage_error("--activation-patch DIR and --patch-target L:STAGE go together")
  end
  if o["patch-positions"] ~= nil and o["activation-patch"] == nil then
    usage_error("--patch-positions needs --activation-patch DIR")
  end
  for _, k in ipairs({ "trace-layers", "trace-ops" }) do
    if o[k] ~= nil and o.trace == nil then usage_error("--%s needs --trace FILE.jsonl", k) end
  end
  for _, k in ipairs({ "capture-layers", "capture-phase", "capture-positions",
    "capture-max-records", "capture-omit-prompt" }) do
    if o[k] ~= nil and o["capture-activations"] == nil then usage_error("--%s needs --capture-activations DIR", k) end
  end
  if o["capture-stages"] ~= nil and o["capture-activations"] == nil and o["activation-stats"] == nil then
    usage_error("--capture-stages needs --capture-activations DIR or --activation-stats FILE")
  end
  -- dumps show the values of an unmodified run; under an experiment they would mix pre- and
  -- post-intervention values (SPEC §7). --trace may run with one.
  for _, dump in ipairs({ "dump-layers", "dump-logits" }) do
    if o[dump] ~= nil then
      for _, k in ipairs(EXPERIMENT_FLAGS) do
        if o[k] ~= nil then
          usage_error("--%s refuses active experiments (--%s): the meaning of pre- vs post-intervention values is "
            .. "not defined for a dump (--trace may run with an experiment)", dump, k)
        end
      end
    end
  end
  if o.model == nil then usage_error("--model FILE.gguf is required") end
  if o.prompt == nil then usage_error("--prompt TEXT is required") end
end

-- run_manifest_path(opts) -> where this run's manifest goes, or nil for none: --run-manifest;
-- else next to the output it describes (inside the capture directory, or beside the statistics
-- file: stats.json -> stats.run.json). A run without outputs writes none unless asked, so that
-- nothing lands in the working directory unasked.
function M.run_manifest_path(o)
  if o["run-manifest"] then return o["run-manifest"] end
  if o["capture-activations"] then return require("ember.store.fs").join(o["capture-activations"], "run.json") end
  local stats = o["activation-stats"]
  if stats then return (stats:gsub("%.json$", "")) .. ".run.json" end
  return nil
end

local function check_layer(flag, layer, info)
  if layer >= info.n_layers then
    usage_error("--%s: layer %d is out of range (the model has %d layers: 0-%d)", flag, layer, info.n_layers,
      info.n_layers - 1)
  end
end

-- steering_experiments(o, model, notice) -> the experiments of --steer and --control-vector (steer
-- first), and their arguments as text for the manifest. Vector files are read here, before the
-- run: a missing or malformed one is a usage error naming the flag and the file.
function M.steering_experiments(o, model, notice)
  local list, text = {}, {}
  if o.steer or o["sae-steer"] then
    local additions = {}
    for i, st in ipairs(o.steer or {}) do
      local okv, r = pcall(require("ember.store.vector_file").read, st.source)
      if not okv then usage_error("--steer: %s", tostring(r)) end
      local stage_width = ({ before_layer = true, after_attention = true, after_mlp = true,
        after_layer = true })[st.stage]
      if stage_width and r.shape[2] ~= model.info.hidden_size then
        usage_error("--steer: vector '%s' has %d values but %s is %d wide (the model's hidden size)", st.source,
          r.shape[2], st.stage, model.info.hidden_size)
      end
      additions[i] = { layer = st.layers, stage = st.stage, vector = r.tensor, scale = st.scale, source = st.source }
      text[#text + 1] = string.format("--steer %s:%s:%s:%g", require("ember.experiments.steer").layers_text(st.layers),
        st.stage, st.source, st.scale)
    end
    for _, st in ipairs(o["sae-steer"] or {}) do
      local ok, sae = pcall(require("ember.sae").load, st.sae, { hook = o["sae-hook"], model = model })
      if not ok then usage_error("--sae-steer: %s", tostring(sae)) end
      local oka, add = pcall(sae.steering, sae, model, st.feature, st.scale)
      if not oka then usage_error("--sae-steer: %s", tostring(add)) end
      additions[#additions + 1] = add
      text[#text + 1] = string.format("--sae-steer %s:%d:%g", st.sae, st.feature, st.scale)
    end
    list[#list + 1] = require("ember.experiments.steer").make { additions = additions, notice = notice }
  end
  if o["control-vector"] then
    local cvec = require("ember.run.control_vector")
    local files = {}
    for i, f in ipairs(o["control-vector"]) do
      local okc, cv = pcall(cvec.read, f.path)
      if not okc then usage_error("--control-vector: %s", tostring(cv)) end
      files[i] = { cv = cv, scale = f.scale }
      text[#text + 1] = string.format("--control-vector %s:%g", f.path, f.scale)
    end
    local range = o["control-vector-layers"]
    if range then text[#text + 1] = string.format("--control-vector-layers %d-%d", range[1], range[2]) end
    local okx, exp = pcall(cvec.experiment, { files = files, layers = range, model = model, notice = notice })
    if not okx then usage_error("--control-vector: %s", tostring(exp)) end
    list[#list + 1] = exp
  end
  return list, table.concat(text, " ")
end

local function run_generate(args, argv, io_)
  local o, pos = flags.parse(args, 1, FLAG)
  if o.help then io_.stdout:write(M.usage()); return 0 end
  if o.version then
    io_.stdout:write("ember " .. require("ember").version .. "\n")
    return 0
  end
  if #pos > 0 then
    if REFUSED_WITH_EXPERIMENTS[pos[1]] then
      for _, k in ipairs(EXPERIMENT_FLAGS) do
        if o[k] ~= nil then refuse_experiments(pos[1], k) end
      end
      usage_error("'%s' must be the first argument: ember %s [options] (ember %s --help)", pos[1], pos[1], pos[1])
    end
    usage_error("unexpected argument '%s'", pos[1])
  end
  if o["extract-hidden"] ~= nil or o["extract-out"] ~= nil or o.prompts ~= nil then
    return require("ember.analysis.extract").cli(o, argv, io_)
  end
  check_combinations(o)

  -- Output locations are checked before the model loads: a run must not be wasted on a typo.
  local fs = require("ember.store.fs")
  -- a run manifest goes next to the output it describes, or where --run-manifest says; none else
  local run_manifest = M.run_manifest_path(o)
  local default_manifest = run_manifest ~= nil and o["run-manifest"] == nil
  local clash = require("ember.run.outputs").check {
    { flag = "--activation-stats", path = o["activation-stats"], kind = "file" },
    { flag = "--capture-activations", path = o["capture-activations"], kind = "dir" },
    { flag = "--run-manifest", path = run_manifest, kind = "file", default = default_manifest },
    { flag = "--trace", path = o.trace, kind = "file" },
    { flag = "--dump-layers", path = o["dump-layers"], kind = "dir" },
    { flag = "--dump-logits", path = o["dump-logits"], kind = "file" },
    -- the logits dump's sidecar is a derived path: it never replaces an existing file
    { flag = "--dump-logits", path = o["dump-logits"] and require("ember.run.dump").logits_sidecar(o["dump-logits"]),
      kind = "file", default = true },
  }
  if clash then usage_error("%s", clash) end
  for _, k in ipairs({ "trace", "dump-logits" }) do
    if o[k] and fs.is_dir(o[k]) then usage_error("--%s: '%s' is a directory (a file path is expected)", k, o[k]) end
  end
  if o["dump-layers"] and fs.exists(o["dump-layers"]) then
    usage_error("--dump-layers: '%s' already exists", o["dump-layers"])
  end
  for _, k in ipairs({ "activation-stats", "capture-activations", "run-manifest", "trace", "dump-layers",
    "dump-logits" }) do
    local path = o[k]
    -- "new/" names the directory "new": its parent is what must exist
    local parent = path and fs.dirname((path:gsub("(.)/+$", "%1")))
    if path and not fs.is_dir(parent) then
      usage_error("--%s: directory '%s' does not exist (so '%s' cannot be created)", k, parent, path)
    end
  end
  for _, k in ipairs({ "activation-patch" }) do
    if o[k] and not fs.is_dir(o[k]) then usage_error("--%s: '%s' is not a directory", k, o[k]) end
  end

  local capture = require("ember.run.capture")
  local cap
  if o["capture-activations"] then
    local cfg, err = capture.config {
      layers = o["capture-layers"], stages = o["capture-stages"], phase = o["capture-phase"],
      positions = o["capture-positions"], max_records = o["capture-max-records"],
      omit_prompt = o["capture-omit-prompt"] == true,
    }
    if not cfg then usage_error("%s", err) end
    cap = { config = cfg, dir = o["capture-activations"] }
    if fs.exists(cap.dir) then usage_error("--capture-activations: '%s' already exists", cap.dir) end
  end

  -- A user experiment file is compiled and run before the model loads, so a broken file fails
  -- fast; its factory is called once the model is there: factory(args, model handle).
  local builtin = require("ember.run.builtin")
  local user_made
  if o.experiment then
    if not fs.exists(o.experiment) then usage_error("--experiment: cannot open '%s'", o.experiment) end
    local okx, made = pcall(builtin.compile, o.experiment)
    if not okx then error("--experiment: " .. tostring(made), 0) end
    user_made = made
  end

  local ember = require("ember")
  -- a run that writes a manifest starts the model's digest before the weights load (background)
  local provenance = o["run-manifest"] ~= nil or o["capture-activations"] ~= nil
  for _, k in ipairs(EXPERIMENT_FLAGS) do provenance = provenance or o[k] ~= nil end
  local ok, model = pcall(ember.load, {
    model = o.model, tokenizer = o.tokenizer, arch = o.arch, kernels = o.kernels, threads = o.threads,
    kv_cache = o["kv-cache"], provenance = provenance, verify_model = o["verify-model"] == true,
  })
  if not ok then error(tostring(model), 0) end
  local info = model.info
  if o.verbose then
    local cpu = ember.cpu()
    io_.stderr:write(string.format(
      "ember: model %s (%s, %s), kernels %s, threads %d (%s; %d physical cores, %d CPUs)\n",
      info.path, info.family, info.dtype_summary, info.kernels, info.threads,
      info.threads_default and "default: the physical cores" or "--threads", cpu.physical_cores, cpu.logical_cores))
  end
  if model.tokenizer == nil then
    local _, why = pcall(require("ember.core").internal.need_tokenizer, model, "ember")
    why = tostring(why):match("the model has no tokenizer %((.*)%)") or "none attached"
    usage_error("--prompt needs a tokenizer and the model has none (%s): give one with --tokenizer FILE", why)
  end
  local max_tokens = o["max-tokens"] or 16
  -- the context the run needs, checked against the model before anything runs (SPEC: the model's
  -- context_length is a limit unless --context says otherwise)
  require("ember.model.generate").check_context(info, #model.tokenizer:encode(o.prompt), max_tokens, o.context or 0,
    function(msg) usage_error("--max-tokens: %s", (msg:gsub("an explicit context", "--context N"))) end,
    function(msg) io_.stderr:write("ember: --context: ", msg, "\n") end)

  -- Range checks need the model; they still come before anything runs.
  if o["zero-layer-output"] then check_layer("zero-layer-output", o["zero-layer-output"].layer, info) end
  if type(o["trace-layers"]) == "table" then
    for _, l in ipairs(o["trace-layers"]) do check_layer("trace-layers", l, info) end
  end
  if o["patch-target"] then check_layer("patch-target", o["patch-target"].layer, info) end
  for _, st in ipairs(o.steer or {}) do
    if st.layers ~= "all" then
      for _, l in ipairs(st.layers) do check_layer("steer", l, info) end
    end
  end
  if cap then
    local okc, err = capture.check(cap.config, info)
    if not okc then usage_error("--%s", err:gsub("^capture layers", "capture-layers")) end
  end

  local user_exp
  if user_made ~= nil then
    local okx, made = pcall(builtin.make, user_made, o.experiment, builtin.args(o["experiment-args"]),
      builtin.handle(model))
    if not okx then error("--experiment: " .. tostring(made), 0) end
    user_exp = made
  end

  local notice = function(msg) io_.stderr:write(msg, "\n") end
  local experiments, exp_args = {}, o["experiment-args"]
  local stats_exp
  if o["zero-layer-output"] then
    local z = o["zero-layer-output"]
    experiments[#experiments + 1] = require("ember.run.builtin").experiment("zero_layer_output",
      { target = string.format("%d:%s", z.layer, z.short), notice = notice })
    exp_args = string.format("%d:%s", z.layer, z.short)
  elseif o["activation-patch"] then
    local patch = require("ember.run.patch")
    experiments[#experiments + 1] = patch.experiment {
      source = o["activation-patch"], target = o["patch-target"], model = model,
      positions = o["patch-positions"] ~= "all" and o["patch-positions"] or nil,
    }
    exp_args = string.format("%s %d:%s", o["activation-patch"], o["patch-target"].layer, o["patch-target"].stage)
    if experiments[#experiments].positions then
      exp_args = exp_args .. " positions=" .. table.concat(experiments[#experiments].positions, ",")
    end
  elseif user_exp then
    experiments[#experiments + 1] = user_exp
  end
  if o.steer or o["sae-steer"] or o["control-vector"] then
    local steer_exps, args_text = M.steering_experiments(o, model, notice)
    for _, e in ipairs(steer_exps) do experiments[#experiments + 1] = e end
    exp_args = args_text
  end
  if o["activation-stats"] then
    stats_exp = require("ember.run.builtin").experiment("activation_stats",
      { output = o["activation-stats"], stages = o["capture-stages"] })
    experiments[#experiments + 1] = stats_exp
  end

  local outputs = {}
  if o["activation-stats"] then outputs.activation_stats = o["activation-stats"] end
  local dumps
  if o["dump-layers"] or o["dump-logits"] then
    dumps = { layers = o["dump-layers"], logits = o["dump-logits"],
      observer = require("ember.run.dump").observer { layers = o["dump-layers"], logits = o["dump-logits"] } }
  end

  -- Text is streamed as it is generated, byte for byte what the final text will be: an exact
  -- detokenizer stream hands back each token's bytes as they complete characters, holding back
  -- only an unfinished UTF-8 character (what is still held at the end is printed with the final
  -- text). The end-of-sequence token is not text.
  local printed, eos = 0, model.tokenizer and model.tokenizer.eos_id
  local stream = model.tokenizer and model.tokenizer:stream { exact = true }
  local function on_token(id)
    if not stream or id == eos then return end
    local chunk = stream:push(id)
    if #chunk > 0 then
      io_.stdout:write(chunk)
      if io_.stdout.flush then io_.stdout:flush() end
      printed = printed + #chunk
    end
  end
  -- the context notice was given above, before the run: generate must not repeat it
  local generate = require("ember.model.generate")
  local saved_notice = generate.notice
  generate.notice = function() end
  local okr, result = pcall(require("ember.run").execute, {
    model = model, tokenizer_path = o.tokenizer, prompt = o.prompt,
    gen = { max_tokens = max_tokens, temperature = o.temperature or 0.0, top_k = o["top-k"] or 0,
      top_p = o["top-p"] or 1.0, seed = o.seed or 0, context = o.context },
    experiments = experiments, capture = cap, experiment_args = exp_args, argv = argv,
    run_manifest = run_manifest, outputs = outputs, on_token = on_token, trace = o.trace, dumps = dumps,
    trace_filter = (o["trace-layers"] or o["trace-ops"])
      and { layers = o["trace-layers"], ops = o["trace-ops"] } or nil,
  })
  generate.notice = saved_notice
  if not okr then error(result, 0) end
  local text = result.out.text or ""
  io_.stdout:write(text:sub(printed + 1), "\n")

  local out = result.out
  if o["activation-patch"] then
    local s = experiments[1].stats
    notice(string.format("ember: this run was MODIFIED by activation-patch: %s layer %d patched from '%s' in %d "
      .. "evaluations (prefill %d, decode %d)", o["patch-target"].stage, o["patch-target"].layer,
      o["activation-patch"], s.applied, s.prefill, s.decode))
  end
  if o.experiment and out.modified then
    notice(string.format("ember: this run was MODIFIED by experiment '%s': it wrote through a view in %d hook "
      .. "calls over %d evaluations (prefill 1, decode %d)", experiments[1].name, out.modified_calls,
      1 + out.stats.decode_count, out.stats.decode_count))
  end
  if stats_exp then
    notice(string.format("ember: activation-stats: %d records written to %s", #stats_exp.records,
      o["activation-stats"]))
  end
  if cap then
    local cm = result.capture_manifest
    notice(string.format("ember: captured %d records into %s", #cm.records, cap.dir))
    if result.capture.stats.dropped > 0 then
      notice(string.format("ember: capture stopped at --capture-max-records %d; %d further records were not captured",
        cap.config.max_records, result.capture.stats.dropped))
    end
  end
  if out.trace then
    notice(string.format("ember: trace: %d events over %d evaluations written to %s (normalized fingerprint %s)",
      out.trace.events, out.trace.evaluations, o.trace, out.trace.fingerprint))
  end
  if dumps and dumps.layers then notice("ember: layer dump written to " .. dumps.layers) end
  if dumps and dumps.logits then notice("ember: logits dump written to " .. dumps.logits) end
  if run_manifest then notice("ember: run manifest written to " .. run_manifest) end
  return 0
end

-- main(arg [, io]) -> exit code. `arg` is the script argument table (arg[1..n]); `io` may replace
-- stdout/stderr (anything with :write) so specs can run the command in-process.
function M.main(arg, io_)
  io_ = io_ or { stdout = io.stdout, stderr = io.stderr }
  local args = {}
  for i = 1, #(arg or {}) do args[i] = arg[i] end
  local argv = { "ember", table.unpack(args) }
  local ok, code = pcall(function()
    if args[1] == "compare-artifacts" then return run_compare(args, io_) end
    if args[1] == "benchmark" then return run_benchmark(args, io_) end
    if args[1] == "sweep" then return require("ember.cli.sweep").main(args, io_) end
    if args[1] == "compare-models" then return require("ember.cli.compare_models").main(args, io_) end
    if args[1] == "attention" then return require("ember.cli.attention").main(args, io_) end
    if args[1] == "control-vector" then return require("ember.cli.control_vector").main(args, io_) end
    if args[1] == "probe" then return require("ember.cli.probe").main(args, argv, io_) end
    if args[1] == "sae" then return require("ember.cli.sae").main(args, argv, io_) end
    if args[1] == "demo" then return require("ember.cli.demo").main(args, argv, io_) end
    if args[1] == "interactive" then return require("ember.cli.interactive").main(args, argv, io_) end
    return run_generate(args, argv, io_)
  end)
  if ok then return code end
  if flags.is_usage_error(code) then
    io_.stderr:write("ember: " .. code.msg .. "\nTry 'ember --help' for the list of flags.\n")
    return 2
  end
  io_.stderr:write("ember: " .. tostring(code) .. "\n")
  return 1
end

-- Run as a script (`ember-lua lib/ember/cli.lua ARGS`; tools/ember runs `ember-lua -m ember.cli`):
-- then `...` holds the command-line arguments rather than the module name given by require, and
-- arg[0] is this file.
if ... ~= "ember.cli" and type(arg) == "table" and type(arg[0]) == "string" and arg[0]:match("cli%.lua$") then
  os.exit(M.main(arg))
end

return M
