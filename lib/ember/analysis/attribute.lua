-- ember.analysis.attribute — attribution patching (AtP): for every component (an attention head,
-- an MLP neuron or the residual stream, at a layer and a position) the first-order estimate of
-- what patching the clean prompt's activation into the corrupted run does to a metric,
-- (a_clean - a_corrupted) · d metric / d a at the corrupted run, from two forward passes and one
-- backward; and the exact patching that checks it (verify). Must not draw or parse flags
-- (cli/attribute.lua does); the gradients are the engine's (model:gradients).

local core = require("ember.core")
local metric_mod = require("ember.sweep.metric")

local M = {}

local function fail(msg, ...) error("attribute: " .. string.format(msg, ...), 0) end

-- The components and the stage each reads: a head's columns of attention_heads, a neuron's column
-- of mlp_activation, a position's row of after_layer (the sweep's default stage).
M.COMPONENTS = { "heads", "neurons", "resid" }
M.STAGE = { heads = "attention_heads", neurons = "mlp_activation", resid = "after_layer" }

local function component_list(v)
  if v == nil then return { table.unpack(M.COMPONENTS) } end
  if type(v) == "string" then
    local list = {}
    for item in v:gmatch("[^,]+") do list[#list + 1] = item end
    v = list
  end
  if type(v) ~= "table" or #v == 0 then fail("components must be a list of %s", table.concat(M.COMPONENTS, ", ")) end
  local seen = {}
  for _, c in ipairs(v) do
    if not M.STAGE[c] then
      fail("unknown component '%s' (components: %s)", tostring(c), table.concat(M.COMPONENTS, ", "))
    end
    seen[c] = true
  end
  local out = {}
  for _, c in ipairs(M.COMPONENTS) do if seen[c] then out[#out + 1] = c end end
  return out
end

local function prompt_ids(model, p, what)
  if type(p) == "table" then return p end
  if type(p) ~= "string" then fail("%s is required (text or a list of token ids)", what) end
  return model:tokenize(p)
end

-- [rows, cols] of ones in blocks: column j sums columns j*width+1 .. (j+1)*width of a product.
local function block_sum_matrix(blocks, width)
  local v = {}
  for r = 0, blocks * width - 1 do
    for c = 0, blocks - 1 do v[#v + 1] = (r // width == c) and 1 or 0 end
  end
  return core.tensor(blocks * width, blocks, v)
end

-- How many units (heads, neurons, 1) component c has per layer, and the [P, units] scores of one
-- layer from the elementwise product (a_clean - a_corrupted) * gradient.
local function unit_scores(model, c, prod, sums)
  local info = model.info
  if c == "neurons" then return prod, prod:shape()[2] end
  if c == "heads" then
    sums.heads = sums.heads or block_sum_matrix(info.n_heads, prod:shape()[2] // info.n_heads)
    return prod:matmul(sums.heads), info.n_heads
  end
  sums.resid = sums.resid or core.tensor(info.hidden_size, 1, (function()
    local v = {}
    for i = 1, info.hidden_size do v[i] = 1 end
    return v
  end)())
  return prod:matmul(sums.resid), 1
end

-- The metric with its tokens decided (metric_mod.resolve) from the two runs' logits.
local function resolve_metric(model, opts, clean_logits, corrupted_ids)
  local m, err = metric_mod.parse(opts.metric or "kl")
  if not m then fail("%s", err) end
  local needs_run = (m.kind == "logit-diff" and #m.tokens == 0)
  local corr_logits = clean_logits
  if needs_run then
    local s = model:session { context = #corrupted_ids }
    corr_logits = s:prefill(corrupted_ids)
  end
  for _, id in ipairs(m.tokens) do
    if id >= model.info.n_vocab then
      fail("metric token %d is outside the vocabulary (0..%d)", id, model.info.n_vocab - 1)
    end
  end
  return metric_mod.resolve(m, clean_logits, corr_logits, model.info.n_vocab)
end

-- How many ranked entries a run keeps: opts.top (default 10000; "all" or math.huge: every one).
local function top_count(v)
  if v == nil then return 10000 end
  if v == "all" or v == math.huge then return math.huge end
  if math.type(v) ~= "integer" or v < 1 then fail("top must be a positive integer or \"all\", got %s", tostring(v)) end
  return v
end

-- A bounded min-heap of (|score|, seq) keeping the n best: a larger |score| is better, on a tie the
-- smaller seq. Most offers compare with the root only, so every component costs a few operations.
local function worse(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] > b[2]) end
local Heap = {}
Heap.__index = Heap
local function new_heap(n) return setmetatable({ n = n, size = 0 }, Heap) end
function Heap:offer(abs, seq)
  if self.size >= self.n then
    local root = self[1]
    if not (root[1] < abs or (root[1] == abs and root[2] > seq)) then return end -- the root is no worse
    self[1] = { abs, seq }
    local i = 1
    while true do -- sift down
      local l, rr, m = 2 * i, 2 * i + 1, i
      if l <= self.size and worse(self[l], self[m]) then m = l end
      if rr <= self.size and worse(self[rr], self[m]) then m = rr end
      if m == i then break end
      self[i], self[m] = self[m], self[i]
      i = m
    end
    return
  end
  self.size = self.size + 1
  local i = self.size
  self[i] = { abs, seq }
  while i > 1 and worse(self[i], self[i // 2]) do -- sift up
    self[i], self[i // 2] = self[i // 2], self[i]
    i = i // 2
  end
end
function Heap:sorted()
  local out = {}
  for i = 1, self.size do out[i] = self[i] end
  table.sort(out, function(a, b) return worse(b, a) end)
  for i, k in ipairs(out) do out[i] = k[2] end
  return out
end

-- entry(r, seq) -> { component, layer, index, position, score, estimate, seq } of component seq
-- (1-based, in the order (component, layer, unit, position)) of a result.
function M.entry(r, seq)
  for i = #r.components, 1, -1 do
    local c = r.components[i]
    if seq > r.base[c] then
      local k, P, units = seq - r.base[c] - 1, r.positions, r.units[c]
      local row, p = k // P, k % P
      local score = r.scores[c]:get(row + 1, p + 1)
      return { component = c, layer = row // units, index = row % units, position = p, score = score,
        estimate = r.corrupted_value + score, seq = seq }
    end
  end
  fail("component %s is outside 1..%d", tostring(seq), r.total)
end

-- scores(opts) -> result (see M.run); no verification.
local function scores(opts)
  local model = opts.model
  if model == nil then fail("model is required") end
  local comps = component_list(opts.components)
  local clean_ids = prompt_ids(model, opts.clean, "clean")
  local corr_ids = prompt_ids(model, opts.corrupted, "corrupted")
  if #clean_ids ~= #corr_ids then
    fail("the clean prompt has %d tokens and the corrupted prompt %d: patching by position needs equal lengths",
      #clean_ids, #corr_ids)
  end
  local stages = {}
  for i, c in ipairs(comps) do stages[i] = M.STAGE[c] end
  local clean = model:run_with_cache { ids = clean_ids, stages = stages }
  local m = resolve_metric(model, opts, clean.logits, corr_ids)
  local gstages = { "after_logits", table.unpack(stages) } -- its value: the corrupted run's logits
  local g = model:gradients { ids = corr_ids, metric = m, stages = gstages, values = true, freeze = opts.freeze,
    reference = m.kind == "kl" and clean.logits or nil }
  local measure = metric_mod.evaluator(m, clean.logits)
  local P, L = #corr_ids, model.info.n_layers
  local corr_value = measure(g:value("after_logits")) -- as exact patching measures it
  local r = { metric = m, clean_ids = clean_ids, corrupted_ids = corr_ids, clean_value = measure(clean.logits),
    corrupted_value = corr_value, components = comps, scores = {}, ranked = {}, n_layers = L, positions = P,
    clean = clean, units = {} }
  local sums, heap, seq = {}, new_heap(top_count(opts.top)), 0
  r.base = {}
  for _, c in ipairs(comps) do
    local stage, grid = M.STAGE[c], {}
    local units
    r.base[c] = seq
    for l = 0, L - 1 do
      local prod = (clean[stage][l] - g:value(stage, l)) * g:get(stage, l)
      local s
      s, units = unit_scores(model, c, prod, sums)
      local v = s:values() -- [P, units] row-major
      for u = 0, units - 1 do
        for p = 0, P - 1 do
          local score = v[p * units + u + 1]
          grid[(l * units + u) * P + p + 1] = score
          seq = seq + 1 -- the fixed order (component, layer, unit, position) that breaks ties
          heap:offer(math.abs(score), seq)
        end
      end
    end
    r.units[c] = units
    r.scores[c] = core.tensor(L * units, P, grid) -- row l * units + u: layer l's unit u, by position
  end
  r.total = seq
  -- largest |score| first; ties in the fixed order
  for i, key in ipairs(heap:sorted()) do
    local e = M.entry(r, key)
    e.rank = i
    r.ranked[i] = e
  end
  return r
end

-- patch(model, r, entry [, fraction]) -> the metric of the corrupted run with entry's component
-- replaced by the clean run's (fraction f: by a_corrupted + f (a_clean - a_corrupted)).
function M.patch(model, r, e, fraction)
  local stage, f = M.STAGE[e.component], fraction or 1
  local src = r.clean[stage][e.layer]
  local row = e.position + 1
  local exp = { name = "attribute-patch" }
  exp[stage] = function(_, ctx, v)
    if ctx.layer_index ~= e.layer then return end
    local c0, c1 = 1, v:shape()[2]
    if e.component == "heads" then
      local hd = c1 // model.info.n_heads
      c0, c1 = e.index * hd + 1, (e.index + 1) * hd
    elseif e.component == "neurons" then
      c0, c1 = e.index + 1, e.index + 1
    end
    for c = c0, c1 do -- the whole patch copies the clean value exactly, as the sweep does
      local a = v:get(row, c)
      v:set(row, c, f == 1 and src:get(row, c) or a + f * (src:get(row, c) - a))
    end
  end
  r.session = r.session or model:session { context = #r.corrupted_ids }
  r.session:reset()
  local logits = r.session:prefill(r.corrupted_ids, { experiment = exp })
  return metric_mod.evaluator(r.metric, r.clean.logits)(logits)
end

-- spearman(x, y) -> Spearman's rank correlation (average ranks for ties), nil under 2 pairs or
-- when either side is constant.
function M.spearman(x, y)
  local n = #x
  if n < 2 then return nil end
  local function ranks(v)
    local idx = {}
    for i = 1, n do idx[i] = i end
    table.sort(idx, function(a, b) return v[a] < v[b] or (v[a] == v[b] and a < b) end)
    local rk, i = {}, 1
    while i <= n do
      local j = i
      while j < n and v[idx[j + 1]] == v[idx[i]] do j = j + 1 end
      for k = i, j do rk[idx[k]] = (i + j) / 2 end
      i = j + 1
    end
    return rk
  end
  local rx, ry = ranks(x), ranks(y)
  local mx, my = (n + 1) / 2, (n + 1) / 2
  local sxy, sxx, syy = 0, 0, 0
  for i = 1, n do
    sxy = sxy + (rx[i] - mx) * (ry[i] - my)
    sxx = sxx + (rx[i] - mx) ^ 2
    syy = syy + (ry[i] - my) ^ 2
  end
  if sxx == 0 or syy == 0 then return nil end
  return sxy / math.sqrt(sxx * syy)
end

-- the mean over the pairs of entry e's exact effect (patch - corrupted value), and its exact value
local function pairs_effect(model, r, e)
  local sum = 0.0
  for _, x in ipairs(r.pairs) do sum = sum + (M.patch(model, x, e) - x.corrupted_value) end
  local effect = sum / #r.pairs
  return r.corrupted_value + effect, effect
end

-- verify(model, r, k, seed) -> { checked = { entry + exact, effect }, rho, false_negatives }:
-- exact patching of the top k by |score| and of k sampled (seeded) from the rest. A false negative
-- is a sampled component whose exact |effect| reaches the smallest exact |effect| of the top k.
function M.verify(model, r, k, seed)
  if math.type(k) ~= "integer" or k < 1 then fail("verify must be a positive integer, got %s", tostring(k)) end
  if k > #r.ranked then fail("verify %d is more than the %d ranked components kept (top =)", k, #r.ranked) end
  local top, taken = {}, {}
  for i = 1, k do
    top[i] = r.ranked[i]
    taken[r.ranked[i].seq] = true
  end
  local state = seed or 1
  local function next_index(n) -- a 64-bit LCG (Knuth's MMIX constants): the same picks everywhere
    state = state * 6364136223846793005 + 1442695040888963407
    return ((state >> 33) % n) + 1
  end
  local sampled, n_rest = {}, r.total - k
  if n_rest <= 2 * k then -- few left: draw from the list of them
    local rest = {}
    for q = 1, r.total do if not taken[q] then rest[#rest + 1] = q end end
    for _ = 1, math.min(k, #rest) do sampled[#sampled + 1] = M.entry(r, table.remove(rest, next_index(#rest))) end
  else -- many: draw until k new ones
    while #sampled < k do
      local q = next_index(r.total)
      if not taken[q] then
        taken[q] = true
        sampled[#sampled + 1] = M.entry(r, q)
      end
    end
  end
  local checked, xs, ys = {}, {}, {}
  local bar = math.huge
  for _, group in ipairs({ { "top", top }, { "sampled", sampled } }) do
    for _, e in ipairs(group[2]) do
      if r.pairs then
        e.exact, e.effect = pairs_effect(model, r, e)
      else
        e.exact = M.patch(model, r, e)
        e.effect = e.exact - r.corrupted_value
      end
      e.group = group[1]
      checked[#checked + 1] = e
      xs[#xs + 1], ys[#ys + 1] = e.score, e.effect
      if group[1] == "top" then bar = math.min(bar, math.abs(e.effect)) end
    end
  end
  local fns = {}
  for _, e in ipairs(sampled) do if math.abs(e.effect) >= bar then fns[#fns + 1] = e end end
  return { k = k, checked = checked, rho = M.spearman(xs, ys), false_negatives = fns }
end

-- ---- a dataset of pairs ----------------------------------------------------------------------
-- Over pairs (sweep --pairs' JSONL or list, one prompt length), every component's score is the mean
-- of the pairs' scores, and verify's exact effect the mean of the pairs' exact effects; ranks,
-- Spearman's rho and the false negatives are those of the means.

-- The mean over the pairs' runs rs of their score grids, into r (scores, ranked, base, total).
local function mean_scores(r, rs, top)
  local heap, n = new_heap(top_count(top)), #rs
  for _, c in ipairs(r.components) do
    local sum = rs[1].scores[c]
    for i = 2, n do sum = sum + rs[i].scores[c] end
    r.scores[c] = sum * (1 / n)
  end
  for seq = 1, r.total do heap:offer(math.abs(M.entry(r, seq).score), seq) end
  r.ranked = {}
  for i, key in ipairs(heap:sorted()) do
    local e = M.entry(r, key)
    e.rank = i
    r.ranked[i] = e
  end
end

local function run_pairs(opts)
  local model = opts.model
  if model == nil then fail("model is required") end
  if opts.clean ~= nil or opts.corrupted ~= nil then fail("give either pairs or clean and corrupted, not both") end
  local pairs_mod = require("ember.sweep.pairs")
  local dataset = pairs_mod.read(model, opts.pairs, 0)
  local m, err = metric_mod.parse(opts.metric or "logit-diff")
  if not m then fail("%s", err) end
  local rs = {}
  for i, it in ipairs(dataset.items) do
    local one = {}
    for k, v in pairs(opts) do if k ~= "pairs" and k ~= "verify" then one[k] = v end end
    one.clean, one.corrupted, one.metric = it.clean_ids, it.corrupted_ids, pairs_mod.metric_for(m, it)
    one.top = "all"
    rs[i] = scores(one)
  end
  local r = setmetatable({ pairs = rs, where = dataset.file, count = #rs }, { __index = rs[1] })
  r.scores, r.base, r.total, r.units, r.components = {}, rs[1].base, rs[1].total, rs[1].units, rs[1].components
  r.positions, r.n_layers, r.metric = rs[1].positions, rs[1].n_layers, rs[1].metric
  local cv, kv = 0.0, 0.0
  for _, x in ipairs(rs) do cv, kv = cv + x.clean_value, kv + x.corrupted_value end
  r.clean_value, r.corrupted_value = cv / #rs, kv / #rs
  mean_scores(r, rs, opts.top)
  return r
end

-- run(opts) -> { metric, clean_value, corrupted_value, components, scores = { heads = Tensor
-- [n_layers * n_heads, P], neurons = [n_layers * n_ff, P], resid = [n_layers, P] }, ranked = {
-- { component, layer, index, position, score, estimate, rank }, ... } (largest |score| first),
-- verify = (when opts.verify = K) }. opts: model, clean, corrupted (text or ids, equal lengths),
-- metric (the sweep's grammar, default kl), components ("heads,neurons,resid" or a list), freeze,
-- verify = K, seed, top = N (ranked keeps the N largest, default 10000; "all": every one; the
-- score grids always hold every one, and r.total counts them). pairs = FILE.jsonl | list instead
-- of clean and corrupted (sweep --pairs' format; metric default logit-diff, each pair's own answer
-- and wrong): the means over the pairs (r.pairs: each pair's run, r.count).
function M.run(opts)
  if type(opts) ~= "table" then fail("expected a table of options") end
  local r = opts.pairs ~= nil and run_pairs(opts) or scores(opts)
  if opts.verify ~= nil then r.verify = M.verify(opts.model, r, opts.verify, opts.seed) end
  return r
end

return M
