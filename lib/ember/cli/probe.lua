-- ember.cli.probe — the `ember probe train|eval` subcommand: reads labelled prompts (extracting
-- their hidden states itself) or an extraction file, trains or applies a probe, reports accuracy.
-- Must not hold numerics (ember.analysis.probe does) nor run with an experiment (SPEC §7: refused first).

local flags = require("ember.cli.flags")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local extract = require("ember.analysis.extract")
local probe = require("ember.analysis.probe")
local selectors = require("ember.run.selectors")

local M = {}

local usage_error = flags.usage_error

local function pool_value(s) return selectors.parse_choice(s, probe.POOLS, "pool") end

local COMMON = {
  { "data", "path", "FILE", "labelled prompts (FILE.jsonl: {\"prompt\": ..., \"label\": ...} per line) or an "
    .. "extraction (FILE.safetensors with its sidecar)" },
  flags.option("model", "the model (JSONL data; an extraction names its own)"),
  flags.option("tokenizer"),
  flags.option("kernels"),
  flags.option("threads"),
}

M.TRAIN_FLAGS = {
  COMMON[1],
  { "layer", "uint", "L", "the layer whose after_layer output is probed (required)" },
  { "out", "path", "PROBE.json", "write the trained probe here" },
  { "holdout", flags.float_in(0, 1, false, true), "F", "share of each class held out for testing (default 0.2)" },
  { "seed", "uint", "S", "seed of the held-out split and of the control's label shuffle (default 0)" },
  { "pool", pool_value, "POOL", "last (the last prompt token, default) | mean (over the prompt tokens)" },
  { "iterations", flags.uint_in(1, 1000000), "N", "gradient-descent iterations (default 500)" },
  { "l2", flags.float_in(0, nil), "X", "L2 penalty (default 0.001)" },
  { "control", "bool", nil, "also train on shuffled labels (same split) and report that held-out accuracy" },
  { "json", "bool", nil, "print the report as one JSON object" },
  COMMON[2], COMMON[3], COMMON[4], COMMON[5],
  flags.option("help"),
}

M.EVAL_FLAGS = {
  { "probe", "path", "PROBE.json", "the probe (required)" },
  COMMON[1],
  { "json", "bool", nil, "print predictions and accuracy as one JSON object" },
  COMMON[2], COMMON[3], COMMON[4], COMMON[5],
  flags.option("help"),
}

function M.usage()
  return flags.usage({
    "usage: ember probe train --data FILE --layer L [--out PROBE.json] [--holdout 0.2] [--seed S] [options]",
    "       ember probe eval --probe PROBE.json --data FILE [options]",
    "",
    "train options:",
  }, M.TRAIN_FLAGS, {
    "",
    "eval options: --probe PROBE.json, --data, --json, --model, --tokenizer, --kernels, --threads",
    "",
    "A probe is linear: logistic for 2 classes, softmax for more, on standardized features (docs/probes.md).",
    "The report goes to stdout; progress (on a terminal) and a summary to stderr. Experiments are refused.",
  })
end

-- ---- examples ----------------------------------------------------------------------------------

local function is_extraction(path)
  return path:match("%.safetensors$") ~= nil or fs.exists(extract.sidecar_path(path)) and not path:match("%.jsonl$")
end

-- progress lines and summaries go where the command's stderr goes (set by main)
local err_stream = io.stderr
local function progress(label, unit)
  return require("ember.sweep.progress").new { label = label, unit = unit, stream = err_stream,
    resumable = false }
end

local function load_model(o)
  local model = flags.load_model(o, { provenance = true })
  if model.tokenizer == nil then
    usage_error("--data: prompts need a tokenizer and the model has none: give one with --tokenizer FILE")
  end
  return model
end

-- examples(o, layer, pool, need_label [, model_sha256]) -> { X, labels, data = section, model =
-- section }: features of every example at `layer`, read from an extraction or extracted here.
-- model_sha256: the model a probe was trained on (eval): a different one is refused.
local function examples(o, layer, pool, need_label, model_sha256, default_model)
  local path = o.data
  if not fs.exists(path) then usage_error("--data: cannot open '%s'", path) end
  if is_extraction(path) then
    if o.model or o.tokenizer then usage_error("--model/--tokenizer: the extraction '%s' names its own model", path) end
    local okr, ex = pcall(extract.read, path)
    if not okr then usage_error("--data: %s", ex) end
    local doc = ex.sidecar
    local has = false
    for _, l in ipairs(doc.layers) do has = has or l == layer end
    if not has then
      usage_error("--data: the extraction '%s' holds layers %s, not layer %d", path, table.concat(doc.layers, ","),
        layer)
    end
    if model_sha256 and doc.model.sha256 ~= model_sha256 then
      usage_error("--data: the extraction '%s' comes from model sha256 %s; the probe was trained on %s", path,
        doc.model.sha256, model_sha256)
    end
    local X, labels = {}, {}
    for i, pr in ipairs(doc.prompts) do
      if need_label and pr.label == json.null then
        usage_error("--data: prompt %d of the extraction '%s' has no label (a probe needs labels)", i - 1, path)
      end
      local t = ex.tensors[pr.tensors[tostring(layer)]]
      X[i] = probe.pool_rows(t.data, t.shape[1], t.shape[2], pool)
      labels[i] = pr.label ~= json.null and pr.label or nil
    end
    return { X = X, labels = labels, n = #doc.prompts, model = doc.model,
      data = { source = "extraction", path = path, sha256 = doc.tensor_file.sha256, count = #doc.prompts } }
  end
  local okp, prompts, digest = pcall(extract.read_prompts, path, "--data", need_label)
  if not okp then usage_error("%s", prompts) end
  if o.model == nil then
    if not default_model then usage_error("--model FILE.gguf is required to extract hidden states from '%s'", path) end
    o.model = default_model
  end
  local model = load_model(o)
  local section = require("ember.store.manifest").model_section(model)
  if model_sha256 and section.sha256 ~= model_sha256 then
    model:close()
    usage_error("--model: '%s' has sha256 %s; the probe was trained on %s", o.model, section.sha256, model_sha256)
  end
  if layer >= model.info.n_layers then
    local n = model.info.n_layers
    model:close()
    usage_error("--layer: layer %d is out of range (the model has %d layers: 0-%d)", layer, n, n - 1)
  end
  local results = extract.run(model, prompts, { layer }, progress("probe: extract", "prompts"))
  local hidden = model.info.hidden_size
  local X, labels = {}, {}
  for i, r in ipairs(results) do
    X[i] = probe.pool_rows(r.hidden[layer], #r.ids, hidden, pool)
    labels[i] = r.label
  end
  model:close()
  return { X = X, labels = labels, n = #results, model = section,
    data = { source = "jsonl", path = path, sha256 = digest, count = #results } }
end

-- ---- train -------------------------------------------------------------------------------------

local function fmt_acc(acc, right, n)
  if acc == nil then return "n/a (nothing held out)" end
  return string.format("%.3f (%d/%d)", acc, right, n)
end

-- train_text(w, t): the training report as text (t: what train measured)
local function train_text(w, t)
  local p, k = t.p, #t.labels
  local parts = {}
  for c = 1, k do parts[c] = string.format("%s %d", tostring(t.labels[c]), t.counts[c]) end
  w:write(string.format("probe      %s on layer %d after_layer (%s token%s), %d features\n", p.kind, t.layer, t.pool,
    t.pool == "mean" and "s" or "", #p.mean))
  w:write(string.format("data       %s (%s): %d examples, %d classes: %s\n", t.ex.data.path, t.ex.data.source, t.ex.n,
    k, table.concat(parts, ", ")))
  w:write(string.format("split      seed %d, holdout %g per class: %d train, %d held out\n", t.seed, t.holdout,
    t.n_train, t.n_held))
  w:write(string.format("train      accuracy %s, loss %.4f after %d iterations\n",
    fmt_acc(t.train_acc, t.train_right, t.n_train), p.loss, p.iterations))
  w:write(string.format("held out   accuracy %s; majority class %s\n", fmt_acc(t.held_acc, t.held_right, t.n_held),
    t.majority and string.format("%.3f", t.majority) or "n/a"))
  if t.control then
    w:write(string.format("control    shuffled labels, held-out accuracy %s\n",
      fmt_acc(t.control_acc, t.control_right, t.n_held)))
  end
end

local function train(args, argv, io_)
  local o = flags.command({ name = "probe train", first = 3, spec = flags.spec(M.TRAIN_FLAGS), usage = M.usage }, args,
    io_)
  if not o then return 0 end
  if o.data == nil then usage_error("probe train: --data FILE is required") end
  if o.layer == nil then usage_error("probe train: --layer L is required") end
  if o.out then
    local parent = fs.dirname(o.out)
    if not fs.is_dir(parent) then usage_error("--out: directory '%s' does not exist", parent) end
    if fs.is_dir(o.out) then usage_error("--out: '%s' is a directory; give a file name", o.out) end
  end
  local holdout = o.holdout or probe.DEFAULTS.holdout
  local seed = o.seed or probe.DEFAULTS.seed
  local pool = o.pool or probe.DEFAULTS.pool
  local ex = examples(o, o.layer, pool, true)
  local okt, res = pcall(probe.train, ex.X, ex.labels, { holdout = holdout, seed = seed, iterations = o.iterations,
    l2 = o.l2, control = o.control }, function(label) return progress(label, "iterations") end)
  if not okt then usage_error("--data: %s", (tostring(res):gsub("^probe: ", ""))) end
  local p, labels, training, counts = res.probe, res.labels, res.training, res.counts
  local tr, held, k = res.train, res.heldout, #res.labels
  local train_acc, held_acc = training.train_accuracy, training.heldout_accuracy ~= json.null
    and training.heldout_accuracy or nil
  local majority = training.heldout_majority ~= json.null and training.heldout_majority or nil
  local control_acc = training.control_heldout_accuracy
  local train_right, held_right, control_right = res.right.train, res.right.heldout, res.right.control
  if o.out then
    fs.write_atomic(o.out, probe.encode(p, { model = ex.model, layer = o.layer, pool = pool, labels = labels,
      training = training, data = ex.data, argv = argv }), "--out")
  end
  if o.json then
    io_.stdout:write(json.encode(json.ordered({ "kind", "layer", "pool", "classes", "counts", "training", "out" }, {
      kind = p.kind, layer = o.layer, pool = pool, classes = json.array({ table.unpack(labels) }),
      counts = json.array(counts),
      training = json.ordered({ "seed", "holdout", "n_train", "n_heldout", "train_accuracy",
        "heldout_accuracy", "heldout_majority", "control_heldout_accuracy", "loss" }, training), out = o.out,
    }), { indent = "  " }))
  else
    train_text(io_.stdout, { p = p, layer = o.layer, pool = pool, ex = ex, labels = labels, counts = counts,
      seed = seed, holdout = holdout, n_train = #tr, n_held = #held, train_acc = train_acc, train_right = train_right,
      held_acc = held_acc, held_right = held_right, majority = majority, control = o.control,
      control_acc = control_acc, control_right = control_right })
  end
  if o.out then io_.stderr:write("ember: probe written to " .. o.out .. "\n") end
  return 0
end

-- ---- eval --------------------------------------------------------------------------------------

local function eval(args, io_)
  local o = flags.command({ name = "probe eval", first = 3, spec = flags.spec(M.EVAL_FLAGS), usage = M.usage }, args,
    io_)
  if not o then return 0 end
  if o.probe == nil then usage_error("probe eval: --probe PROBE.json is required") end
  if o.data == nil then usage_error("probe eval: --data FILE is required") end
  if not fs.exists(o.probe) then usage_error("--probe: cannot open '%s'", o.probe) end
  local okd, p = pcall(function() return probe.decode(fs.read(o.probe, "--probe", probe.MAX_PROBE_BYTES),
    "--probe '" .. o.probe .. "'") end)
  if not okd then usage_error("%s", p) end
  local doc = p.doc
  local ex = examples(o, doc.layer, doc.pool, false, doc.model.sha256, doc.model.path)
  if #ex.X[1] ~= doc.hidden_size then
    usage_error("--data: features are %d wide, the probe expects %d", #ex.X[1], doc.hidden_size)
  end
  local _, index = probe.classes(doc.classes)
  local preds, right, labelled = {}, 0, 0
  for i, x in ipairs(ex.X) do
    local c, probs = probe.predict(p, x)
    local label = ex.labels[i]
    local correct = nil
    if label ~= nil then
      labelled = labelled + 1
      correct = index[label] == c
      if correct then right = right + 1 end
    end
    preds[i] = { index = i - 1, prediction = doc.classes[c], p = probs[c], label = label, correct = correct }
  end
  local acc = labelled > 0 and right / labelled or nil
  if o.json then
    local list = json.array()
    for i, r in ipairs(preds) do
      list[i] = json.ordered({ "index", "prediction", "p", "label", "correct" }, {
        index = r.index, prediction = r.prediction, p = r.p, label = r.label == nil and json.null or r.label,
        correct = r.correct == nil and json.null or r.correct })
    end
    io_.stdout:write(json.encode(json.ordered({ "probe", "layer", "labelled", "correct", "accuracy", "predictions" }, {
      probe = o.probe, layer = doc.layer, labelled = labelled, correct = right, accuracy = acc or json.null,
      predictions = list }), { indent = "  " }))
  else
    for _, r in ipairs(preds) do
      io_.stdout:write(string.format("%d\t%s\tp=%.4f%s\n", r.index, tostring(r.prediction), r.p,
        r.label ~= nil and string.format("\tlabel=%s\t%s", tostring(r.label), r.correct and "ok" or "wrong") or ""))
    end
    if acc then io_.stdout:write(string.format("accuracy %.3f (%d/%d)\n", acc, right, labelled)) end
  end
  return 0
end

-- main(args, argv, io_) -> exit code; args[1] is "probe" (experiments were refused before: ember.cli).
function M.main(args, argv, io_)
  err_stream = io_.stderr
  local sub = args[2]
  if sub == "train" then return train(args, argv, io_) end
  if sub == "eval" then return eval(args, io_) end
  if sub == nil or sub == "--help" or sub == "-h" then
    io_.stdout:write(M.usage())
    return sub == nil and 2 or 0
  end
  usage_error("probe: unknown subcommand '%s' (train | eval)", sub)
end

return M
