-- ember.analysis.probe — linear probes on hidden states: features from extracted after_layer outputs, a
-- deterministic stratified held-out split, logistic (2 classes) / softmax (k classes) regression
-- by full-batch gradient descent in Lua doubles, the probe file, and the probe object of
-- ember.probe (the same training as `ember probe train`). Must not run the model.
--
-- Determinism: the split and the label shuffle use splitmix64 on Lua integers (wrapping 64-bit
-- arithmetic, the same on every platform); training visits examples in index order with a fixed
-- step size and iteration count, so one input gives one probe, bit for bit.

local core = require("ember.core")
local json = require("ember.store.json")
local core = require("ember.core")

local M = {}

M.SCHEMA = "ember.probe"
M.SCHEMA_VERSION = "1.0.0"
M.SCHEMA_MAJOR = 1
-- The largest probe file read (fs.read's bound): a JSON of classes x hidden_size weights.
M.MAX_PROBE_BYTES = 1 << 28
M.POOLS = { "last", "mean" }
M.DEFAULTS = { holdout = 0.2, seed = 0, iterations = 500, l2 = 1e-3, pool = "last" }

-- ---- deterministic randomness ------------------------------------------------------------------

-- rng(seed) -> next(n): integers uniform in [0, n) from splitmix64 (the top 53 bits, so the
-- modulo bias is below 2^-40 for any n a dataset has).
function M.rng(seed)
  local state = math.tointeger(seed) or 0
  return function(n)
    state = state + 0x9E3779B97F4A7C15
    local z = state
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    z = z ~ (z >> 31)
    return (z >> 11) % n
  end
end

-- shuffle(list, seed) -> a new list, Fisher-Yates with rng(seed).
function M.shuffle(list, seed)
  local out, next_int = { table.unpack(list) }, M.rng(seed)
  for i = #out, 2, -1 do
    local j = next_int(i) + 1
    out[i], out[j] = out[j], out[i]
  end
  return out
end

-- ---- labels and the split ----------------------------------------------------------------------

-- classes(labels) -> sorted distinct labels (integers before strings, each group in natural
-- order), index: label -> 1-based class. Labels are compared as given: 1 and "1" are two classes.
function M.classes(labels)
  local seen, list = {}, {}
  for _, l in ipairs(labels) do
    if seen[l] == nil then seen[l] = true; list[#list + 1] = l end
  end
  table.sort(list, function(a, b)
    if type(a) ~= type(b) then return type(a) == "number" end
    return a < b
  end)
  local index = {}
  for i, l in ipairs(list) do index[l] = i end
  return list, index
end

-- split(y, k, holdout, seed) -> train, heldout: lists of example indices (ascending). Stratified:
-- each class's examples are shuffled with the seed and round(n_c * holdout) of them held out,
-- keeping at least one for training; so every class is in the training set whenever it has two
-- examples or more, and the held-out share is the same per class.
function M.split(y, k, holdout, seed)
  local by_class = {}
  for c = 1, k do by_class[c] = {} end
  for i, c in ipairs(y) do table.insert(by_class[c], i) end
  local train, held = {}, {}
  for c = 1, k do
    local members = M.shuffle(by_class[c], (seed or 0) * 1000003 + c)
    local n_held = math.floor(#members * holdout + 0.5)
    if n_held >= #members then n_held = #members - 1 end
    for j, i in ipairs(members) do
      if j <= n_held then held[#held + 1] = i else train[#train + 1] = i end
    end
  end
  table.sort(train)
  table.sort(held)
  return train, held
end

-- ---- features ----------------------------------------------------------------------------------

-- pool_rows(bytes, rows, cols, pool) -> Lua array of cols doubles: the last row, or the mean of
-- the rows (summed in row order in doubles), of a little-endian f32 [rows, cols] matrix.
function M.pool_rows(bytes, rows, cols, pool)
  local v = {}
  if pool == "last" then
    local base = (rows - 1) * cols * 4
    for j = 1, cols do v[j] = (string.unpack("<f", bytes, base + (j - 1) * 4 + 1)) end
    return v
  end
  if pool ~= "mean" then error("probe: unknown pool '" .. tostring(pool) .. "' (last | mean)", 0) end
  for j = 1, cols do v[j] = 0.0 end
  local pos = 1
  for _ = 1, rows do
    for j = 1, cols do
      local x
      x, pos = string.unpack("<f", bytes, pos)
      v[j] = v[j] + x
    end
  end
  for j = 1, cols do v[j] = v[j] / rows end
  return v
end

-- ---- training ----------------------------------------------------------------------------------

local exp, log = math.exp, math.log
local softmax = require("ember.analysis.distribution").softmax -- in double, as the fit

-- Class probabilities of one standardized example (logits z, k of them; k = 2 uses one logit).
local function probabilities(p, x)
  local k, d = #p.classes, #x
  if p.kind == "logistic" then
    local w, s = p.weights[1], p.bias[1]
    for j = 1, d do s = s + w[j] * x[j] end
    -- class 2 is the positive one: p2 = sigmoid(s), computed without overflow for either sign
    local p2 = s >= 0 and 1 / (1 + exp(-s)) or exp(s) / (1 + exp(s))
    return { 1 - p2, p2 }
  end
  local z = {}
  for c = 1, k do
    local w, s = p.weights[c], p.bias[c]
    for j = 1, d do s = s + w[j] * x[j] end
    z[c] = s
  end
  return softmax(z)
end

local function standardize(p, raw)
  local x = {}
  for j = 1, #raw do x[j] = (raw[j] - p.mean[j]) / p.std[j] end
  return x
end

-- fit(X, y, k, opts [, progress]) -> probe table { kind, classes (1..k, filled by the caller),
-- mean, std, weights, bias, loss, iterations, learning_rate, l2 }.
-- X: list of feature arrays (the training examples), y: their classes (1..k).
-- Features are standardized with the training mean and standard deviation (a constant feature
-- keeps std 1). The loss is the mean cross-entropy plus l2/2 |W|^2. Step size 1/L with L an upper
-- bound of the loss's curvature: the standardized features' second moments sum to d, so the
-- Hessian's largest eigenvalue is at most d/4 (logistic) or d/2 (softmax), plus l2.
function M.fit(X, y, k, opts, progress)
  opts = opts or {}
  local n, d = #X, #X[1]
  local iterations, l2 = opts.iterations or M.DEFAULTS.iterations, opts.l2 or M.DEFAULTS.l2
  local mean, std = {}, {}
  for j = 1, d do
    local s = 0.0
    for i = 1, n do s = s + X[i][j] end
    mean[j] = s / n
    local v = 0.0
    for i = 1, n do local t = X[i][j] - mean[j]; v = v + t * t end
    v = math.sqrt(v / n)
    std[j] = v > 0 and v or 1.0
  end
  local p = { kind = k == 2 and "logistic" or "softmax", classes = {}, mean = mean, std = std, weights = {}, bias = {} }
  for c = 1, k do p.classes[c] = c end
  local rows = k == 2 and 1 or k
  for r = 1, rows do
    p.weights[r] = {}
    for j = 1, d do p.weights[r][j] = 0.0 end
    p.bias[r] = 0.0
  end
  local Z = {}
  for i = 1, n do Z[i] = standardize(p, X[i]) end
  local lr = 1 / ((k == 2 and d / 4 or d / 2) + l2)
  if progress then progress:start(iterations, 0) end
  local loss
  for _ = 1, iterations do
    local gw, gb = {}, {}
    for r = 1, rows do
      gw[r] = {}
      for j = 1, d do gw[r][j] = 0.0 end
      gb[r] = 0.0
    end
    loss = 0.0
    for i = 1, n do
      local x, probs = Z[i], probabilities(p, Z[i])
      loss = loss - log(math.max(probs[y[i]], 1e-300))
      for r = 1, rows do
        -- d(loss)/d(logit r): logistic's one logit is class 2's
        local g = k == 2 and (probs[2] - (y[i] == 2 and 1 or 0)) or (probs[r] - (y[i] == r and 1 or 0))
        local row = gw[r]
        for j = 1, d do row[j] = row[j] + g * x[j] end
        gb[r] = gb[r] + g
      end
    end
    loss = loss / n
    for r = 1, rows do
      local w = p.weights[r]
      for j = 1, d do
        loss = loss + 0.5 * l2 * w[j] * w[j]
        w[j] = w[j] - lr * (gw[r][j] / n + l2 * w[j])
      end
      p.bias[r] = p.bias[r] - lr * gb[r] / n
    end
    if progress then progress:step() end
  end
  if progress then progress:finish(true) end
  p.loss, p.iterations, p.learning_rate, p.l2 = loss, iterations, lr, l2
  return p
end

-- predict(p, raw) -> class index (1-based; ties go to the lower index), probabilities.
function M.predict(p, raw)
  local probs = probabilities(p, standardize(p, raw))
  local best = 1
  for c = 2, #probs do if probs[c] > probs[best] then best = c end end
  return best, probs
end

-- accuracy(p, X, y, idx) -> share of idx whose prediction equals y (nil for an empty idx), correct.
function M.accuracy(p, X, y, idx)
  if #idx == 0 then return nil, 0 end
  local right = 0
  for _, i in ipairs(idx) do
    if M.predict(p, X[i]) == y[i] then right = right + 1 end
  end
  return right / #idx, right
end

-- majority(y, idx, k) -> the share of idx in its most frequent class: the accuracy of always
-- guessing that class (the chance level a probe is compared with).
function M.majority(y, idx, k)
  if #idx == 0 then return nil end
  local count = {}
  for c = 1, k do count[c] = 0 end
  for _, i in ipairs(idx) do count[y[i]] = count[y[i]] + 1 end
  local best = 0
  for c = 1, k do if count[c] > best then best = count[c] end end
  return best / #idx
end

-- ---- one training, as `ember probe train` and ember.probe.train run it --------------------------

local function subset(idx, v)
  local out = {}
  for j, i in ipairs(idx) do out[j] = v[i] end
  return out
end

-- train(X, labels, opts [, progress]) -> { probe, labels (the classes), y, train, heldout, counts,
-- training }. X: one feature array per example, labels: one label per example (at least two
-- distinct). opts: holdout, seed, iterations, l2, control (also fit on labels shuffled with seed
-- + 0x5EED, the same split, and report its held-out accuracy). progress(label) -> a reporter or
-- nil. `training` is the probe file's training section.
function M.train(X, labels, opts, progress)
  opts = opts or {}
  local holdout, seed = opts.holdout or M.DEFAULTS.holdout, opts.seed or M.DEFAULTS.seed
  local classes, index = M.classes(labels)
  local k = #classes
  if k < 2 then error(string.format("probe: every example has the label %s; a probe needs at least 2 classes",
    tostring(classes[1])), 0) end
  local y = {}
  for i, l in ipairs(labels) do y[i] = index[l] end
  local tr, held = M.split(y, k, holdout, seed)
  local fit_opts = { iterations = opts.iterations, l2 = opts.l2 }
  local function reporter(label) return progress and progress(label) or nil end
  local p = M.fit(subset(tr, X), subset(tr, y), k, fit_opts, reporter("probe: train"))
  local train_acc, train_right = M.accuracy(p, X, y, tr)
  local held_acc, held_right = M.accuracy(p, X, y, held)
  local majority = M.majority(y, held, k)
  local control_acc, control_right
  if opts.control then
    -- the same split and training, the labels permuted among all examples: what the features give
    -- when the labels carry no information about them
    local yc = M.shuffle(y, seed + 0x5EED)
    local pc = M.fit(subset(tr, X), subset(tr, yc), k, fit_opts, reporter("probe: control"))
    control_acc, control_right = M.accuracy(pc, X, yc, held)
  end
  local counts = {}
  for c = 1, k do counts[c] = 0 end
  for _, c in ipairs(y) do counts[c] = counts[c] + 1 end
  return { probe = p, labels = classes, y = y, train = tr, heldout = held, counts = counts,
    right = { train = train_right, heldout = held_right, control = control_right },
    training = { seed = seed, holdout = holdout, iterations = p.iterations, learning_rate = p.learning_rate,
      l2 = p.l2, loss = p.loss, n_train = #tr, n_heldout = #held, train_accuracy = train_acc,
      heldout_accuracy = held_acc or json.null, heldout_majority = majority or json.null,
      control_heldout_accuracy = control_acc } }
end

-- ---- the probe file ----------------------------------------------------------------------------

local ORDER = { "schema", "schema_version", "created_at_unix", "tool", "kind", "model", "stage", "layer", "pool",
  "hidden_size", "classes", "standardize", "weights", "bias", "training", "data", "argv" }

local function floats(list)
  local out = json.array()
  for i, v in ipairs(list) do out[i] = v + 0.0 end
  return out
end

-- encode(p, prov) -> JSON text of a trained probe. prov: { model = model section (path, sha256,
-- ...), layer, pool, labels (class list), training = {...}, data = { source, path, sha256, count },
-- argv }.
function M.encode(p, prov)
  local weights = json.array()
  for r, w in ipairs(p.weights) do weights[r] = floats(w) end
  local argv = json.array()
  for i, a in ipairs(prov.argv or {}) do argv[i] = tostring(a) end
  return json.encode(json.ordered(ORDER, {
    schema = M.SCHEMA, schema_version = M.SCHEMA_VERSION, created_at_unix = os.time(),
    tool = json.ordered({ "name", "version" }, { name = "ember", version = core.version }),
    kind = p.kind, model = prov.model, stage = "after_layer", layer = prov.layer, pool = prov.pool,
    hidden_size = #p.mean, classes = json.array({ table.unpack(prov.labels) }),
    standardize = json.ordered({ "mean", "std" }, { mean = floats(p.mean), std = floats(p.std) }),
    weights = weights, bias = floats(p.bias),
    training = json.ordered({ "seed", "holdout", "iterations", "learning_rate", "l2", "loss", "n_train", "n_heldout",
      "train_accuracy", "heldout_accuracy", "heldout_majority", "control_heldout_accuracy" }, prov.training),
    data = json.ordered({ "source", "path", "sha256", "count" }, prov.data), argv = argv,
  }), { indent = "  " })
end

-- decode(text, what) -> probe table (as fit returns, classes = the labels) plus .doc, the whole
-- file. Checks the schema and every shape; errors name `what`.
function M.decode(text, what)
  local doc = json.decode(text, what)
  local function bad(msg, ...) error(string.format("%s: " .. msg, what, ...), 0) end
  if type(doc) ~= "table" or doc.schema ~= M.SCHEMA then
    bad("not an ember probe file (schema %s)", tostring(type(doc) == "table" and doc.schema))
  end
  local major = tonumber(tostring(doc.schema_version):match("^(%d+)%."))
  if major ~= M.SCHEMA_MAJOR then bad("schema_version %s is not readable here", tostring(doc.schema_version)) end
  if doc.kind ~= "logistic" and doc.kind ~= "softmax" then
    bad("kind must be logistic or softmax, got %s", tostring(doc.kind))
  end
  local k, d = type(doc.classes) == "table" and #doc.classes or 0, doc.hidden_size
  if k < 2 then bad("a probe needs at least 2 classes") end
  if math.type(d) ~= "integer" or d < 1 then bad("hidden_size must be a positive integer") end
  if math.type(doc.layer) ~= "integer" or doc.layer < 0 then bad("layer must be a non-negative integer") end
  local rows = doc.kind == "logistic" and 1 or k
  if doc.kind == "logistic" and k ~= 2 then bad("a logistic probe has 2 classes, this one %d", k) end
  local function vec(v, n, name)
    if type(v) ~= "table" or #v ~= n then bad("%s must hold %d numbers", name, n) end
    local out = {}
    for i = 1, n do
      if type(v[i]) ~= "number" then bad("%s[%d] is not a number", name, i) end
      out[i] = v[i] + 0.0
    end
    return out
  end
  local st = type(doc.standardize) == "table" and doc.standardize or {}
  local p = { kind = doc.kind, classes = doc.classes, mean = vec(st.mean, d, "standardize.mean"),
    std = vec(st.std, d, "standardize.std"), weights = {}, bias = vec(doc.bias, rows, "bias"), doc = doc }
  if type(doc.weights) ~= "table" or #doc.weights ~= rows then bad("weights must hold %d rows", rows) end
  for r = 1, rows do p.weights[r] = vec(doc.weights[r], d, "weights[" .. r .. "]") end
  for j = 1, d do if p.std[j] <= 0 then bad("standardize.std[%d] must be positive", j) end end
  if doc.pool ~= "last" and doc.pool ~= "mean" then bad("pool must be last or mean, got %s", tostring(doc.pool)) end
  return p
end

-- ---- probes from Lua: ember.probe.train{...}, ember.probe.load(path) ------------------------------

local Probe = { __name = "ember.Probe" }
Probe.__index = Probe

local function fail(msg, ...) error("probe: " .. string.format(msg, ...), 0) end

local function is_tensor(t)
  local mt = getmetatable(t)
  local name = type(mt) == "table" and rawget(mt, "__name")
  return name == "ember.Tensor" or name == "ember.TensorView"
end

-- features(x, pool, what) -> one feature array per example: each row of a [n, d] tensor, or each
-- tensor of a list pooled over its rows (its last row or their mean, as the CLI's --pool).
local function features(x, pool, what)
  local X = {}
  if is_tensor(x) then
    local shape = x:shape()
    for r = 1, shape[1] do X[r] = M.pool_rows(x:row(r):bytes(), 1, shape[2], "last") end
  elseif type(x) == "table" and #x > 0 then
    for i, t in ipairs(x) do
      if not is_tensor(t) then fail("%s[%d] is a %s, not an ember.Tensor", what, i, type(t)) end
      local shape = t:shape()
      X[i] = M.pool_rows(t:bytes(), shape[1], shape[2], pool)
    end
  else
    fail("%s must be a tensor [examples, features] or a list of tensors, got %s", what, type(x))
  end
  if #X == 0 then fail("%s holds no example", what) end
  for i = 2, #X do
    if #X[i] ~= #X[1] then fail("%s: example %d has %d features, example 1 has %d", what, i, #X[i], #X[1]) end
  end
  return X
end

local TRAIN_OPTIONS = { x = true, y = true, pool = true, holdout = true, seed = true, iterations = true, l2 = true,
  control = true }

-- train_probe(opts) -> Probe: opts.x (a tensor [n, d], or a list of n tensors pooled by opts.pool),
-- opts.y (n labels), and holdout, seed, iterations, l2, control as for `ember probe train`.
function M.train_probe(opts)
  if type(opts) ~= "table" then fail("train expects a table of options, got %s", type(opts)) end
  for k in pairs(opts) do if not TRAIN_OPTIONS[k] then fail("train: unknown option '%s'", tostring(k)) end end
  local pool = opts.pool or M.DEFAULTS.pool
  if pool ~= "last" and pool ~= "mean" then fail("pool must be last or mean, got %s", tostring(pool)) end
  local X = features(opts.x, pool, "x")
  if type(opts.y) ~= "table" or #opts.y ~= #X then
    fail("y must hold one label per example (%d), got %s", #X, type(opts.y) == "table" and #opts.y or type(opts.y))
  end
  local res = M.train(X, opts.y, opts)
  local obj = { kind = res.probe.kind, classes = res.labels, pool = pool, hidden_size = #X[1],
    training = res.training, train = res.train, heldout = res.heldout, counts = res.counts, _p = res.probe }
  return setmetatable(obj, Probe)
end

-- probe:predict(t) -> labels, probabilities: one predicted label per example of t (rows of a
-- tensor, or a list of tensors pooled as in training), and an ember.Tensor [n, classes].
function Probe:predict(t)
  local X = features(t, self.pool, "predict's argument")
  if #X[1] ~= self.hidden_size then
    fail("predict: %d features per example, the probe has %d", #X[1], self.hidden_size)
  end
  local labels, flat = {}, {}
  for i, x in ipairs(X) do
    local c, probs = M.predict(self._p, x)
    labels[i] = self.classes[c]
    for _, v in ipairs(probs) do flat[#flat + 1] = v end
  end
  return labels, core.tensor(#X, #self.classes, flat)
end

-- probe:save(path, { layer = L, model = m }) writes the probe file `ember probe eval` reads (the
-- layer its features come from is required; the model, when given, is recorded by its sha256).
function Probe:save(path, prov)
  prov = prov or {}
  if math.type(prov.layer) ~= "integer" or prov.layer < 0 then fail("save: layer = L (0-based) is required") end
  local msec = prov.model and require("ember.store.manifest").model_section(prov.model) or json.null
  local text = M.encode(self._p, { model = msec, layer = prov.layer, pool = self.pool, labels = self.classes,
    training = self.training, data = { source = "lua", path = json.null, sha256 = json.null,
      count = (self.training.n_train or 0) + (self.training.n_heldout or 0) } })
  require("ember.store.fs").write_atomic(path, text, "probe")
  return true
end

-- load(path) -> Probe from a probe file (as `ember probe train --out` writes it)
function M.load_probe(path)
  local fs = require("ember.store.fs")
  local p = M.decode(fs.read(path, "probe", M.MAX_PROBE_BYTES), "probe '" .. tostring(path) .. "'")
  return setmetatable({ kind = p.kind, classes = p.classes, pool = p.doc.pool, hidden_size = #p.mean,
    training = p.doc.training, layer = p.doc.layer, _p = p }, Probe)
end

return M
