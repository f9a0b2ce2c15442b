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

M.FLAGS = {
  flags.option("arch"),
  flags.option("model"),
  flags.option("tokenizer"),
  { "prompt", "string", "TEXT", "the prompt (required)" },
  { "max-tokens", flags.uint_in(0, flags.MAX_CONTEXT, "the largest session"), "N", "tokens to generate (default 16)" },
  flags.option("temperature"),
  flags.option("top-k"),
  flags.option("top-p"),
  { "seed", "uint", "N", "sampling seed (default 0)" },
  flags.option("context"),
  flags.option("threads"),
  flags.option("kernels"),
  flags.option("kv-cache"),
  flags.option("override-from"),
  flags.option("override-tensors"),
  { "experiment", "path", "FILE.lua", "attach the experiment this file returns" },
  { "experiment-args", "string", "STR", "argument string given to the experiment's factory" },
  { "activation-stats", "path", "FILE.json", "observe every hook; write statistics JSON (SPEC §5)" },
  { "zero-layer-output", zero_value, "L:STAGE", "zero layer L's attention|mlp output or finished layer" },
  { "ablate-expert", selectors.parse_layer_expert, "L:E",
    "ban expert E from layer L's routing (mixture-of-experts models; 0-based; repeatable)", many = true },
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
    "stages to capture (and to --activation-stats): all | before_layer,attention_pattern,... (default: the "
      .. "residual stream)" },
  { "capture-phase", selectors.parse_phase, "PHASE", "prefill | decode | all (default all)" },
  { "capture-positions", selectors.parse_index_list, "LIST", "decode positions to capture: all | 5,7-9" },
  { "capture-max-records", positive, "N", "stop capturing after N records" },
  { "capture-omit-prompt", "bool", nil, "store only the prompt's sha256, not its text" },
  { "activation-patch", "path", "DIR", "patch activations from this captured artifact" },
  { "patch-target", patch_value, "L:STAGE", "the layer and stage to patch (e.g. 4:after_mlp)" },
  { "patch-positions", selectors.parse_index_list, "LIST",
    "patch only these positions: all | 0,3-5 (prefill rows, decode positions)" },
  { "allow-foreign-source", "bool", nil,
    "patch from an artifact captured with another model of the same family and width (recorded, announced)" },
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
  flags.option("verify-model"),
  { "verbose", "bool", nil, "say on stderr what the run uses (model, kernel set, threads and why)" },
  flags.option("help"),
  { "version", "bool", nil, "show the version" },
}
local FLAG = flags.spec(M.FLAGS)

local usage_error = flags.usage_error

function M.usage()
  return flags.usage({
    "usage: ember --model FILE.gguf --prompt TEXT [options]",
    "       ember compare-artifacts DIR_A DIR_B [--records] [--json] [--require CLASS]",
    "       ember benchmark --model FILE.gguf [options]   (ember benchmark --help)",
    "       ember sweep --model FILE.gguf --clean TEXT --corrupted TEXT --out DIR   (ember sweep --help)",
    "       ember compare-models A.gguf B.gguf --prompt TEXT --out DIR   (ember compare-models --help)",
    "       ember quant-recipe --reference A.gguf --quantized B.gguf --prompts FILE.jsonl --out DIR   "
      .. "(ember quant-recipe --help)",
    "       ember --model FILE.gguf --prompts FILE.jsonl --extract-hidden LAYERS --extract-out FILE.safetensors",
    "       ember attention --model FILE.gguf --prompt TEXT --layer L [--head H]   (ember attention --help)",
    "       ember attribute --model FILE.gguf --clean TEXT --corrupted TEXT --metric M [--verify K] --out DIR",
    "       ember control-vector --model FILE.gguf --positive P.jsonl --negative N.jsonl --out CV.gguf",
    "       ember tokens --model FILE.gguf TEXT   (index, id and piece of every token; ember tokens --help)",
    "       ember verify DIR [--kernels SET] [--threads N]   (replay a capture, compare it bit for bit)",
    "       ember probe train|eval ...   (ember probe --help)",
    "       ember sae eval|top|compare ...   (ember sae --help)",
    "       ember demo [--model FILE.gguf]   (ember demo --help)",
    "       ember interactive [--model FILE.gguf] [options]   (ember interactive --help)",
    "",
    "options:",
  }, M.FLAGS, {
    "",
    table.concat(require("ember.cli.compare_artifacts").help_lines(), "\n"),
    "",
    "Generated text goes to stdout, notices to stderr. Exit: 0 ok, 1 failure, 2 usage error.",
    "A run manifest goes into the capture directory (DIR/run.json), else beside the --activation-stats file",
    "(stats.json -> stats.run.json), else where --run-manifest says; otherwise none is written.",
  })
end

-- ---- the subcommands -------------------------------------------------------------------------------

-- `ember NAME ...` runs require(module).main(args, argv, io_) -> exit code, args[1] being NAME (one
-- signature for all); any other command line is the generation command below. The inspection
-- surfaces refuse experiment flags before anything else is read (SPEC §7).
M.COMMANDS = {
  { name = "compare-artifacts", module = "ember.cli.compare_artifacts" },
  { name = "benchmark", module = "ember.cli.benchmark", refuses_experiments = true },
  { name = "sweep", module = "ember.cli.sweep" },
  { name = "compare-models", module = "ember.cli.compare_models" },
  { name = "quant-recipe", module = "ember.cli.quant_recipe", refuses_experiments = true },
  { name = "attention", module = "ember.cli.attention", refuses_experiments = true },
  { name = "attribute", module = "ember.cli.attribute", refuses_experiments = true },
  { name = "tokens", module = "ember.cli.tokens", refuses_experiments = true },
  { name = "verify", module = "ember.cli.verify", refuses_experiments = true },
  { name = "control-vector", module = "ember.cli.control_vector", refuses_experiments = true },
  { name = "probe", module = "ember.cli.probe", refuses_experiments = true },
  { name = "sae", module = "ember.cli.sae", refuses_experiments = true },
  { name = "demo", module = "ember.cli.demo", refuses_experiments = true },
  { name = "interactive", module = "ember.cli.interactive", refuses_experiments = true },
}
local COMMAND = {}
for _, c in ipairs(M.COMMANDS) do COMMAND[c.name] = c end

local EXPERIMENT_FLAGS = flags.EXPERIMENT_FLAGS
local refuse_experiments = flags.refuse_experiments

-- ---- the generation command -----------------------------------------------------------------------

local function check_combinations(o)
  local interventions = {}
  for _, k in ipairs({ "zero-layer-output", "ablate-expert", "activation-patch", "experiment" }) do
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
  for _, k in ipairs({ "patch-positions", "allow-foreign-source" }) do
    if o[k] ~= nil and o["activation-patch"] == nil then usage_error("--%s needs --activation-patch DIR", k) end
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
      if selectors.RESIDUAL_LAYER_STAGE_SET[st.stage] and r.shape[2] ~= model.info.hidden_size then
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

-- The generation command is a list of steps, run in order on one state r = { args, argv, io, o, ... }:
-- each reads what the steps before it left in r, adds its own, and raises usage errors naming the
-- flag. A step that returns an exit code ends the command there (--help, --version, an extraction).
-- Everything a flag can get wrong is checked before the model loads, and the ranges that need the
-- model before anything runs.

-- parse: the flags; --help and --version; a subcommand name given after flags
local function parse(r)
  local o, pos = flags.command({ first = 1, spec = FLAG, usage = M.usage, positionals = true }, r.args, r.io)
  if not o then return 0 end
  if o.version then
    r.io.stdout:write("ember " .. require("ember").version .. "\n")
    return 0
  end
  if #pos > 0 then
    local c = COMMAND[pos[1]]
    if c and c.refuses_experiments then
      for _, k in ipairs(EXPERIMENT_FLAGS) do
        if o[k] ~= nil then refuse_experiments(pos[1], k) end
      end
      usage_error("'%s' must be the first argument: ember %s [options] (ember %s --help)", pos[1], pos[1], pos[1])
    end
    usage_error("unexpected argument '%s'", pos[1])
  end
  r.o = o
end

-- extraction: --extract-hidden (or its companions) makes this an extraction instead of a generation
local function extraction(r)
  local o = r.o
  if o["extract-hidden"] ~= nil or o["extract-out"] ~= nil or o.prompts ~= nil then
    return require("ember.cli.extract").run(o, r.argv, r.io)
  end
end

local function combinations(r) check_combinations(r.o) end

-- outputs: every output location checked together, before the model loads (a run must not be
-- wasted on a typo); the run manifest goes next to the output it describes, or where --run-manifest says
local function outputs(r)
  local o, fs = r.o, require("ember.store.fs")
  r.run_manifest = M.run_manifest_path(o)
  local outs = require("ember.run.outputs")
  local list = {
    { flag = "--activation-stats", path = o["activation-stats"], kind = "file" },
    { flag = "--capture-activations", path = o["capture-activations"], kind = "dir" },
    { flag = "--run-manifest", path = r.run_manifest, kind = "file",
      default = r.run_manifest ~= nil and o["run-manifest"] == nil },
    { flag = "--trace", path = o.trace, kind = "file" },
    { flag = "--dump-layers", path = o["dump-layers"], kind = "dir" },
    { flag = "--dump-logits", path = o["dump-logits"], kind = "file" },
    -- the logits dump's sidecar is a derived path: it never replaces an existing file
    { flag = "--dump-logits", path = o["dump-logits"] and require("ember.run.dump").logits_sidecar(o["dump-logits"]),
      kind = "file", default = true },
  }
  local clash = outs.check(list)
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
  local unwritable = outs.writable(list)
  if unwritable then usage_error("%s", unwritable) end
  if o["activation-patch"] and not fs.is_dir(o["activation-patch"]) then
    usage_error("--%s: '%s' is not a directory", "activation-patch", o["activation-patch"])
  end
end

-- capture: the --capture-* selection, checked as far as it can be without the model
local function capture_config(r)
  local o = r.o
  if not o["capture-activations"] then return end
  local cfg, err = require("ember.run.capture").config {
    layers = o["capture-layers"], stages = o["capture-stages"], phase = o["capture-phase"],
    positions = o["capture-positions"], max_records = o["capture-max-records"],
    omit_prompt = o["capture-omit-prompt"] == true,
  }
  if not cfg then usage_error("%s", err) end
  r.cap = { config = cfg, dir = o["capture-activations"] }
  if require("ember.store.fs").exists(r.cap.dir) then
    usage_error("--capture-activations: '%s' already exists", r.cap.dir)
  end
end

-- experiment file: compiled and run before the model loads, so a broken file fails fast; its
-- factory is called once the model is there (experiments)
local function experiment_file(r)
  local o = r.o
  if not o.experiment then return end
  if not require("ember.store.fs").exists(o.experiment) then
    usage_error("--experiment: cannot open '%s'", o.experiment)
  end
  local okx, made = pcall(require("ember.run.builtin").compile, o.experiment)
  if not okx then error("--experiment: " .. tostring(made), 0) end
  r.user_made = made
end

-- model: loaded (a run that writes a manifest starts the model's digest first, in the background);
-- --verbose says what it runs on; the tokenizer and the context the run needs are checked
local function model(r)
  local o, io_ = r.o, r.io
  local provenance = o["run-manifest"] ~= nil or o["capture-activations"] ~= nil
  for _, k in ipairs(EXPERIMENT_FLAGS) do provenance = provenance or o[k] ~= nil end
  local m = flags.load_model(o, { provenance = provenance })
  r.model = m
  local info = m.info
  if o.verbose then
    local cpu = require("ember.core").cpu()
    io_.stderr:write(string.format(
      "ember: model %s (%s, %s), kernels %s, threads %d (%s; %d physical cores, %d CPUs)\n", info.path, info.family,
      info.dtype_summary, info.kernels, info.threads,
      info.threads_default and "default: the physical cores" or "--threads", cpu.physical_cores, cpu.logical_cores))
  end
  if m.tokenizer == nil then
    local _, why = pcall(require("ember.core").internal.need_tokenizer, m, "ember")
    why = tostring(why):match("the model has no tokenizer %((.*)%)") or "none attached"
    usage_error("--prompt needs a tokenizer and the model has none (%s): give one with --tokenizer FILE", why)
  end
  r.max_tokens = o["max-tokens"] or 16
  -- the context the run needs, checked against the model before anything runs (SPEC: the model's
  -- context_length is a limit unless --context says otherwise)
  require("ember.model.generate").check_context(info, #m.tokenizer:encode(o.prompt), r.max_tokens, o.context or 0,
    function(msg) usage_error("--max-tokens: %s", (msg:gsub("an explicit context", "--context N"))) end,
    function(msg) io_.stderr:write("ember: --context: ", msg, "\n") end)
end

-- ranges: the layer numbers of the flags against the model, before anything runs
local function ranges(r)
  local o, info = r.o, r.model.info
  if o["zero-layer-output"] then check_layer("zero-layer-output", o["zero-layer-output"].layer, info) end
  for _, t in ipairs(o["ablate-expert"] or {}) do check_layer("ablate-expert", t.layer, info) end
  if o["ablate-expert"] then
    local families = {}
    for _, row in ipairs(require("ember.core").STAGES) do
      if row.name == "moe_router" then families = row.families or {} end
    end
    if not families[info.family] then
      usage_error("--ablate-expert: the model is %s, not a mixture-of-experts model (%s)", info.family,
        table.concat(families, ", "))
    end
  end
  if type(o["trace-layers"]) == "table" then
    for _, l in ipairs(o["trace-layers"]) do check_layer("trace-layers", l, info) end
  end
  if o["patch-target"] then check_layer("patch-target", o["patch-target"].layer, info) end
  for _, st in ipairs(o.steer or {}) do
    if st.layers ~= "all" then
      for _, l in ipairs(st.layers) do check_layer("steer", l, info) end
    end
  end
  if r.cap then
    local okc, err = require("ember.run.capture").check(r.cap.config, info)
    if not okc then usage_error("--%s", err:gsub("^capture layers", "capture-layers")) end
  end
end

-- intervention(r) -> the one intervention of --zero-layer-output, --activation-patch or
-- --experiment (check_combinations allows one), and its arguments for the manifest
local function intervention(r)
  local o, builtin = r.o, require("ember.run.builtin")
  if o["zero-layer-output"] then
    local z = o["zero-layer-output"]
    local target = string.format("%d:%s", z.layer, z.short)
    return builtin.experiment("zero_layer_output", { target = target, notice = r.notice }), target
  elseif o["ablate-expert"] then
    local text = {}
    for i, t in ipairs(o["ablate-expert"]) do text[i] = string.format("%d:%d", t.layer, t.expert) end
    return builtin.experiment("ablate_expert", { targets = o["ablate-expert"], notice = r.notice }),
      table.concat(text, ",")
  elseif o["activation-patch"] then
    local exp = require("ember.run.patch").experiment {
      source = o["activation-patch"], target = o["patch-target"], model = r.model,
      positions = o["patch-positions"] ~= "all" and o["patch-positions"] or nil,
      allow_foreign_source = o["allow-foreign-source"] == true, notice = r.notice,
    }
    local text = string.format("%s %d:%s", o["activation-patch"], o["patch-target"].layer, o["patch-target"].stage)
    if exp.positions then text = text .. " positions=" .. table.concat(exp.positions, ",") end
    return exp, text
  elseif r.user_made ~= nil then
    local okx, made = pcall(builtin.make, r.user_made, o.experiment, builtin.args(o["experiment-args"]),
      builtin.handle(r.model))
    if not okx then error("--experiment: " .. tostring(made), 0) end
    return made, o["experiment-args"]
  end
  return nil, o["experiment-args"]
end

-- experiments: the intervention, the steering additions, then --activation-stats (an observer)
local function experiments(r)
  local o = r.o
  r.notice = function(msg) r.io.stderr:write(msg, "\n") end
  local list = {}
  local exp, exp_args = intervention(r)
  list[#list + 1] = exp
  if o.steer or o["sae-steer"] or o["control-vector"] then
    local steer_exps, args_text = M.steering_experiments(o, r.model, r.notice)
    for _, e in ipairs(steer_exps) do list[#list + 1] = e end
    exp_args = args_text
  end
  if o["activation-stats"] then
    r.stats_exp = require("ember.run.builtin").experiment("activation_stats",
      { output = o["activation-stats"], stages = o["capture-stages"] })
    list[#list + 1] = r.stats_exp
  end
  r.experiments, r.exp_args = list, exp_args
end

-- stream: text is streamed as it is generated, byte for byte what the final text will be: an exact
-- detokenizer stream hands back each token's bytes as they complete characters, holding back only
-- an unfinished UTF-8 character (what is still held at the end is printed with the final text).
-- The end-of-sequence token is not text.
local function stream(r)
  local tok, out = r.model.tokenizer, r.io.stdout
  local eos, st = tok and tok.eos_id, tok and tok:stream { exact = true }
  r.printed = 0
  r.on_token = function(id)
    if not st or id == eos then return end
    local chunk = st:push(id)
    if #chunk > 0 then
      out:write(chunk)
      if out.flush then out:flush() end
      r.printed = r.printed + #chunk
    end
  end
end

-- run: one generation through ember.run (experiments, capture, dumps, trace, manifest), then the
-- rest of the text
local function run(r)
  local o = r.o
  local dumps
  if o["dump-layers"] or o["dump-logits"] then
    dumps = { layers = o["dump-layers"], logits = o["dump-logits"],
      observer = require("ember.run.dump").observer { layers = o["dump-layers"], logits = o["dump-logits"] } }
  end
  r.dumps = dumps
  -- the context notice was given before the run (model): generate must not repeat it
  local generate = require("ember.model.generate")
  local saved_notice = generate.notice
  generate.notice = function() end
  local okr, result = pcall(require("ember.run").execute, {
    model = r.model, tokenizer_path = o.tokenizer, prompt = o.prompt,
    gen = { max_tokens = r.max_tokens, temperature = o.temperature or 0.0, top_k = o["top-k"] or 0,
      top_p = o["top-p"] or 1.0, seed = o.seed or 0, context = o.context },
    experiments = r.experiments, capture = r.cap, experiment_args = r.exp_args, argv = r.argv,
    run_manifest = r.run_manifest, outputs = { activation_stats = o["activation-stats"] }, on_token = r.on_token,
    trace = o.trace, dumps = dumps,
    trace_filter = (o["trace-layers"] or o["trace-ops"]) and { layers = o["trace-layers"], ops = o["trace-ops"] }
      or nil,
  })
  generate.notice = saved_notice
  if not okr then error(result, 0) end
  r.result = result
  r.io.stdout:write((result.out.text or ""):sub(r.printed + 1), "\n")
end

-- report: what the run changed and wrote, on stderr
local function report(r)
  local o, out, notice = r.o, r.result.out, r.notice
  if o["activation-patch"] then
    local s = r.experiments[1].stats
    notice(string.format("ember: this run was MODIFIED by activation-patch: %s layer %d patched from '%s' in %d "
      .. "evaluations (prefill %d, decode %d)", o["patch-target"].stage, o["patch-target"].layer,
      o["activation-patch"], s.applied, s.prefill, s.decode))
  end
  if o.experiment and out.modified then
    notice(string.format("ember: this run was MODIFIED by experiment '%s': it wrote through a view in %d hook "
      .. "calls over %d evaluations (prefill 1, decode %d)", r.experiments[1].name, out.modified_calls,
      1 + out.stats.decode_count, out.stats.decode_count))
  end
  if r.stats_exp then
    notice(string.format("ember: activation-stats: %d records written to %s", #r.stats_exp.records,
      o["activation-stats"]))
  end
  if r.cap then
    notice(string.format("ember: captured %d records into %s", #r.result.capture_manifest.records, r.cap.dir))
    if r.result.capture.stats.dropped > 0 then
      notice(string.format("ember: capture stopped at --capture-max-records %d; %d further records were not captured",
        r.cap.config.max_records, r.result.capture.stats.dropped))
    end
  end
  if out.trace then
    notice(string.format("ember: trace: %d events over %d evaluations written to %s (normalized fingerprint %s)",
      out.trace.events, out.trace.evaluations, o.trace, out.trace.fingerprint))
  end
  if r.dumps and r.dumps.layers then notice("ember: layer dump written to " .. r.dumps.layers) end
  if r.dumps and r.dumps.logits then notice("ember: logits dump written to " .. r.dumps.logits) end
  if r.run_manifest then notice("ember: run manifest written to " .. r.run_manifest) end
  return 0
end

M.GENERATE_STEPS = {
  { "parse", parse }, { "extraction", extraction }, { "combinations", combinations }, { "outputs", outputs },
  { "capture", capture_config }, { "experiment file", experiment_file }, { "model", model }, { "ranges", ranges },
  { "experiments", experiments }, { "stream", stream }, { "run", run }, { "report", report },
}

local function run_generate(args, argv, io_)
  local r = { args = args, argv = argv, io = io_ }
  for _, step in ipairs(M.GENERATE_STEPS) do
    local code = step[2](r)
    if code then return code end
  end
  return 0
end

-- main(arg [, io]) -> exit code. `arg` is the script argument table (arg[1..n]); `io` may replace
-- stdout/stderr (anything with :write) so specs can run the command in-process.
function M.main(arg, io_)
  io_ = io_ or { stdout = io.stdout, stderr = io.stderr }
  local args = {}
  for i = 1, #(arg or {}) do args[i] = arg[i] end
  local argv = { "ember", table.unpack(args) }
  local c = COMMAND[args[1]]
  local ok, code = pcall(function()
    if not c then return run_generate(args, argv, io_) end
    if c.refuses_experiments then flags.refuse_experiment_args(c.name, args, 2) end
    return require(c.module).main(args, argv, io_)
  end)
  if ok then return code end
  if flags.is_usage_error(code) then
    -- the list of the command's own flags
    io_.stderr:write("ember: " .. code.msg .. "\nTry 'ember " .. (c and (c.name .. " ") or "") .. "--help' for the "
      .. "list of flags.\n")
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
