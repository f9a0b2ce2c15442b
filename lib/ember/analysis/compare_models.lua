-- ember.analysis.compare_models — two files of the same model in different weight types (F32 vs Q8_0, ...)
-- on the same tokens: per-layer, per-stage divergence of B from A, then causal localisation: A's
-- activation patched into B layer by layer, and the share of B's output divergence that recovers.
-- Must not parse flags, print or draw (cli/compare_models.lua does); it returns a report.
--
-- "The same tokens": A generates greedily; B is fed A's prompt and A's generated tokens (teacher
-- forcing), so every evaluation of B lines up with one of A, in prefill and in decode.

local artifact = require("ember.store.artifact")
local capture = require("ember.run.capture")
local compare = require("ember.analysis.compare")
local distribution = require("ember.analysis.distribution")
local json = require("ember.store.json")
local manifest = require("ember.store.manifest")
local patch = require("ember.run.patch")
local selectors = require("ember.run.selectors")
local metric_mod = require("ember.sweep.metric")
local token_label = require("ember.analysis.token_label")
local core = require("ember.core")

local M = {}

local function fail(msg, ...) error("compare-models: " .. string.format(msg, ...), 0) end

-- The models must be the same network: same family and shapes (weights may differ in type).
local function check_pair(a, b)
  for _, k in ipairs({ "family", "n_layers", "hidden_size", "n_vocab" }) do
    if a.info[k] ~= b.info[k] then
      fail("the models are not the same network: %s is %s in A (%s) and %s in B (%s)", k, tostring(a.info[k]),
        a.info.path, tostring(b.info[k]), b.info.path)
    end
  end
end

-- One pass over the token sequence: prefill `ids`, then decode each token of `feed` (A chooses them
-- greedily when feed is nil). Returns the logits of every evaluation and the tokens fed.
local function pass(model, ids, n, feed, exp)
  local s = model:session { context = #ids + n }
  local opts = exp and { experiment = exp } or nil
  local logits = { s:prefill(ids, opts) }
  local tokens = {}
  for k = 1, n do
    local t = feed and feed[k] or (logits[#logits]:argmax() - 1)
    tokens[k] = t
    logits[#logits + 1] = s:decode(t, opts)
  end
  s:close()
  return logits, tokens
end

-- KL(A || B) of two next-token distributions, in double (ember.analysis.distribution).
local function kl(la, lb)
  return distribution.kl(distribution.softmax(la:values()), distribution.softmax(lb:values()))
end

-- How far B's outputs are from A's: KL and top-1 agreement, prefill and decode apart.
local function output_divergence(la, lb)
  local r = { kl_prefill = kl(la[1], lb[1]), top1_prefill = la[1]:argmax() == lb[1]:argmax(), exact = true }
  local sum, agree = 0.0, 0
  for i = 1, #la do
    if la[i]:bytes() ~= lb[i]:bytes() then r.exact = false end
    if i > 1 then
      sum = sum + kl(la[i], lb[i])
      if la[i]:argmax() == lb[i]:argmax() then agree = agree + 1 end
    end
  end
  local nd = #la - 1
  r.kl_decode = nd > 0 and sum / nd or json.null
  r.top1_decode = nd > 0 and agree / nd or json.null
  r.kl_mean = (r.kl_prefill + sum) / #la
  r.top1_agreement = ((r.top1_prefill and 1 or 0) + agree) / #la
  return r
end

local function recovered(base, now)
  if base == json.null or now == json.null or base == 0 then return json.null end
  return (base - now) / base
end

-- With --metric M (a logit difference or a probability): M of each evaluation's logits, as
-- { prefill, decode (mean over the decode steps), mean (over every evaluation) }.
local function metric_values(measure, logits)
  local pre, sum = measure(logits[1]), 0.0
  for i = 2, #logits do sum = sum + measure(logits[i]) end
  local nd = #logits - 1
  return { prefill = pre, decode = nd > 0 and sum / nd or json.null, mean = (pre + sum) / #logits }
end

-- The share of the gap between B's value and A's that the patched run closes (0 = B, 1 = A).
local function gap_closed(va, vb, vp)
  if va == json.null or vb == json.null or vp == json.null or va == vb then return json.null end
  return (vp - vb) / (va - vb)
end

-- divergence(cap_a, cap_b) -> rows: per (stage, layer), the prefill tensor's divergence of B from
-- A, and the decode steps' mean / worst
local function divergence(cap_a, cap_b)
  local by_key = {}
  for _, r in ipairs(cap_b.records) do by_key[artifact.record_key(r)] = r end
  local rows, index = {}, {}
  for _, ra in ipairs(cap_a.records) do
    local rb = by_key[artifact.record_key(ra)]
    local key = ra.stage .. "|" .. tostring(ra.layer)
    local row = index[key]
    if not row then
      row = { stage = ra.stage, layer = ra.layer, decode = { n = 0, rel_l2 = 0.0, cosine = math.huge, max_abs = 0.0 } }
      index[key] = row
      rows[#rows + 1] = row
    end
    local m = compare.metrics(ra, rb)
    if ra.phase == "prefill" then
      row.prefill = { rel_l2 = m.rel_l2 or json.null, cosine = m.cosine or json.null, max_abs = m.max_abs_diff }
    else
      local d = row.decode
      d.n = d.n + 1
      d.rel_l2 = d.rel_l2 + (m.rel_l2 or 0)
      d.cosine = math.min(d.cosine, m.cosine or 1)
      d.max_abs = math.max(d.max_abs, m.max_abs_diff)
    end
  end
  for _, row in ipairs(rows) do
    local d = row.decode
    if d.n > 0 then
      row.decode = { rel_l2 = d.rel_l2 / d.n, cosine = d.cosine, max_abs = d.max_abs, steps = d.n }
    else
      row.decode = json.null
    end
  end
  return rows
end

-- localisation(p, cells) -> the cells of the localisation grid this shard computes: A's activation
-- at (stage, layer) patched into B, and how much of B's output divergence that recovers.
-- p: { a, b, ids, n, gen, la (A's logits), base (B's output divergence), src (A's records), step, shard,
-- measure (the --metric's evaluator, nil for kl) }
local function localisation(p, cells)
  local function localise(stage, layer)
    local e = patch.experiment { source = p.src, target = { layer = layer, stage = stage }, model = p.b }
    local lp = pass(p.b, p.ids, p.n, p.gen, e)
    e:on_generation_complete()
    p.step()
    local o, base = output_divergence(p.la, lp), p.base
    local row = { stage = stage, layer = layer == nil and json.null or layer, kl_prefill = o.kl_prefill,
      kl_decode = o.kl_decode, top1_agreement = o.top1_agreement, logits_exact = o.exact,
      recovered_prefill = recovered(base.kl_prefill, o.kl_prefill),
      recovered_decode = recovered(base.kl_decode, o.kl_decode),
      recovered = recovered(base.kl_mean, o.kl_mean) }
    if p.measure then -- the shares are of the metric's gap between B and A instead
      local v, va, vb = metric_values(p.measure, lp), base.metric_a, base.metric_b
      row.metric_prefill, row.metric_decode = v.prefill, v.decode
      row.recovered_prefill = gap_closed(va.prefill, vb.prefill, v.prefill)
      row.recovered_decode = gap_closed(va.decode, vb.decode, v.decode)
      row.recovered = gap_closed(va.mean, vb.mean, v.mean)
    end
    return row
  end
  local shard, list = p.shard, {}
  for i, c in ipairs(cells) do
    if shard == nil or (i - 1) % shard.count == shard.index then
      local l = localise(c[1], c[2])
      l.index = i - 1
      list[#list + 1] = l
    end
  end
  return list
end

local function model_info(m)
  return { path = m.info.path, sha256 = (manifest.model_sha256(m)), dtype = m.info.dtype_summary,
    kernels = m.info.kernels, threads = m.info.threads }
end

-- run(opts) -> report. opts: { a = ember.Model, b = ember.Model, prompt = text | ids = {...},
--   max_tokens = 4, stages = {...} (localisation stages, default {"after_layer"}), on_step = fn,
--   shard = { index, count } (only the localisation cells with index mod count = index),
--   metric = a parsed metric with token ids (ember.sweep.metric; default kl): with a logit
--   difference or a probability the recovered shares are of that metric's gap between B and A }
function M.run(opts)
  local a, b = opts.a, opts.b
  check_pair(a, b)
  local ids = opts.ids or a:tokenize(opts.prompt)
  local n = opts.max_tokens or 4
  local stages = opts.stages or { "after_layer" }
  for _, s in ipairs(stages) do
    local ok, why = selectors.check_residual_layer_stage(s)
    if not ok then fail("localisation %s", why) end
  end
  local step = opts.on_step or function() end

  -- A greedy and B teacher-forced, every stage of every layer captured
  local all = assert(capture.config {})
  local cap_a, cap_b = capture.experiment(all), capture.experiment(all)
  local la, gen = pass(a, ids, n, nil, cap_a)
  local lb = pass(b, ids, n, gen, cap_b)
  step()
  for i, r in ipairs(cap_a.records) do r.index = i - 1 end
  local src = { dir = "model A (" .. a.info.path .. ")", manifest = { model = { family = a.info.family } },
    records = cap_a.records }
  local rows = divergence(cap_a, cap_b)
  local base = output_divergence(la, lb)
  local metric = metric_mod.resolve(opts.metric or { kind = "kl", tokens = {} }, la[1], lb[1], a.info.n_vocab,
    { "A", "B" })
  local measure = metric.kind ~= "kl" and metric_mod.evaluator(metric) or nil
  if measure then base.metric_a, base.metric_b = metric_values(measure, la), metric_values(measure, lb) end
  -- the localisation grid: each stage x layer, then the end of the network (A's logits in B must
  -- make B's outputs A's, bit for bit); a shard computes every count-th cell
  local cells = {}
  for _, stage in ipairs(stages) do
    for layer = 0, a.info.n_layers - 1 do cells[#cells + 1] = { stage, layer } end
  end
  cells[#cells + 1] = { "after_logits", nil }
  local list = localisation({ a = a, b = b, ids = ids, n = n, gen = gen, la = la, base = base, src = src,
    step = step, shard = opts.shard, measure = measure }, cells)
  return { tool_version = core.version, a = model_info(a), b = model_info(b), family = a.info.family,
    n_layers = a.info.n_layers, prompt_ids = ids, generated_ids = gen, evaluations = #la, output = base,
    divergence = rows, localisation = list, stages = stages, cells = #cells, shard = opts.shard,
    metric = { kind = metric.kind, tokens = metric.tokens,
      label = metric_mod.label(metric, function(id) return token_label.token(a, id) end) } }
end

-- What must agree for two reports to be parts of one comparison (the shard itself aside).
M.SEMANTIC = { "tool_version", "a.sha256", "b.sha256", "a.kernels", "b.kernels", "prompt_ids", "generated_ids",
  "stages", "cells", "output_divergence", "metric.kind", "metric.tokens" }

-- What a shard's report carries into the plots' titles and series names is checked where it is
-- read: dtypes printable (no control byte, valid UTF-8), stages among the per-layer stages.
local function check_text(r, i)
  for _, side in ipairs({ "a", "b" }) do
    local d = type(r[side]) == "table" and r[side].dtype or nil
    if not token_label.is_printable(d) then
      fail("merge: report %d: %s.dtype is not printable text (%s); the report was not written by ember", i, side,
        type(d) == "string" and ("'" .. token_label.printable(d) .. "'") or type(d))
    end
  end
  if type(r.stages) ~= "table" then fail("merge: report %d: missing or invalid 'stages'", i) end
  for k, st in ipairs(r.stages) do
    if not selectors.RESIDUAL_LAYER_STAGE_SET[st] then
      fail("merge: report %d: stages[%d] is '%s', not a per-layer stage", i, k - 1, token_label.printable(st))
    end
  end
end

-- merge(reports) -> one report holding every localisation cell; reports are decoded report.json
-- tables of the shards of one comparison. Refuses, naming the field, shards of another one.
function M.merge(reports)
  if #reports == 0 then fail("merge: no reports given") end
  local first = reports[1]
  local function get(r, path)
    local v = r
    for k in path:gmatch("[^.]+") do v = type(v) == "table" and v[k] or nil end
    return json.encode(v)
  end
  local seen, rows, shards = {}, {}, {}
  for i, r in ipairs(reports) do
    if type(r.shard) ~= "table" then fail("merge: report %d was not made with --shard", i) end
    check_text(r, i)
    for _, p in ipairs(M.SEMANTIC) do
      if get(r, p) ~= get(first, p) then
        fail("merge: report %d does not belong with report 1: %s differs (%s vs %s)", i, p, get(r, p), get(first, p))
      end
    end
    if r.shard.count ~= first.shard.count then fail("merge: report %d is one of %d shards, report 1 of %d", i,
      r.shard.count, first.shard.count) end
    if shards[r.shard.index] then fail("merge: reports %d and %d are both shard %d/%d", shards[r.shard.index], i,
      r.shard.index, r.shard.count) end
    shards[r.shard.index] = i
    for _, l in ipairs(r.localisation) do
      if seen[l.index] then fail("merge: localisation cell %d is in two reports", l.index) end
      seen[l.index] = true
      rows[#rows + 1] = l
    end
  end
  for k = 0, first.shard.count - 1 do
    if not shards[k] then fail("merge: shard %d/%d is missing", k, first.shard.count) end
  end
  table.sort(rows, function(x, y) return x.index < y.index end)
  -- back to the in-memory shape: the logits stages have no layer (nil, not JSON null)
  for _, r in ipairs(first.divergence) do if r.layer == json.null then r.layer = nil end end
  local out = {}
  for k, v in pairs(first) do out[k] = v end
  out.localisation, out.shard, out.plot = rows, nil, nil
  out.output, out.output_divergence = first.output_divergence, nil
  out.a, out.b = first.a, first.b
  return out
end

-- to_json(report) -> JSON text with a fixed key order
function M.to_json(r)
  local function ordered(keys, t) return json.ordered(keys, t) end
  local MODEL = { "path", "sha256", "dtype", "kernels", "threads" }
  local div = json.array()
  for i, row in ipairs(r.divergence) do
    local p = row.prefill and ordered({ "rel_l2", "cosine", "max_abs" }, row.prefill) or json.null
    local d = row.decode ~= json.null and ordered({ "rel_l2", "cosine", "max_abs", "steps" }, row.decode) or json.null
    div[i] = ordered({ "stage", "layer", "prefill", "decode" }, { stage = row.stage,
      layer = row.layer == nil and json.null or row.layer, prefill = p, decode = d })
  end
  local loc = json.array()
  for i, l in ipairs(r.localisation) do
    loc[i] = ordered({ "index", "stage", "layer", "kl_prefill", "kl_decode", "metric_prefill", "metric_decode",
      "top1_agreement", "recovered_prefill", "recovered_decode", "recovered", "logits_exact" }, l)
  end
  local o = r.output
  for _, k in ipairs({ "metric_a", "metric_b" }) do
    if type(o[k]) == "table" then ordered({ "prefill", "decode", "mean" }, o[k]) end
  end
  local m = r.metric or { kind = "kl", tokens = {}, label = metric_mod.label({ kind = "kl" }) }
  return json.encode(ordered({ "schema", "schema_version", "tool_version", "a", "b", "family", "n_layers",
    "prompt_ids", "generated_ids", "evaluations", "stages", "cells", "shard", "metric", "output_divergence",
    "divergence", "localisation", "notes", "plot" }, {
    schema = "ember.compare-models", schema_version = "1.0.0", tool_version = r.tool_version,
    stages = json.array({ table.unpack(r.stages) }), cells = r.cells,
    shard = r.shard and ordered({ "index", "count" }, r.shard) or json.null,
    a = ordered(MODEL, r.a), b = ordered(MODEL, r.b), family = r.family, n_layers = r.n_layers,
    prompt_ids = json.array({ table.unpack(r.prompt_ids) }),
    generated_ids = json.array({ table.unpack(r.generated_ids) }),
    evaluations = r.evaluations,
    metric = ordered({ "kind", "tokens", "label" }, { kind = m.kind, tokens = json.array({ table.unpack(m.tokens) }),
      label = m.label }),
    output_divergence = ordered({ "kl_prefill", "kl_decode", "kl_mean", "top1_prefill", "top1_decode",
      "top1_agreement", "exact", "metric_a", "metric_b" }, o),
    divergence = div, localisation = loc, notes = json.array(M.notes(r)), plot = r.plot,
  }), { indent = "  " })
end

local function g(v) return v == json.null and "-" or string.format("%.4g", v) end

M.NOTE_ROWS = 4 -- rows a note names before "and N more"

-- notes(report) -> the report's explanations, one string each: today, of negative recovered shares
-- (the first NOTE_ROWS rows named)
function M.notes(r)
  local by_metric = r.metric and r.metric.kind ~= "kl"
  local neg = {}
  for _, l in ipairs(r.localisation) do
    for _, ph in ipairs({ "prefill", "decode" }) do
      local v = l["recovered_" .. ph]
      if v ~= json.null and v ~= nil and v < 0 then
        local where = string.format("%s %s %s: %s", l.stage, l.layer == json.null and "-" or tostring(l.layer), ph,
          g(v))
        if by_metric then
          neg[#neg + 1] = string.format("%s (%s %s; B alone %s, A %s)", where, r.metric.kind, g(l["metric_" .. ph]),
            g(r.output.metric_b[ph]), g(r.output.metric_a[ph]))
        else
          neg[#neg + 1] = string.format("%s (KL %s against B's own %s)", where, g(l["kl_" .. ph]),
            g(r.output["kl_" .. ph]))
        end
      end
    end
  end
  if #neg == 0 then return {} end
  local shown = { table.unpack(neg, 1, math.min(#neg, M.NOTE_ROWS)) }
  if #neg > M.NOTE_ROWS then shown[#shown + 1] = string.format("and %d more", #neg - M.NOTE_ROWS) end
  return { "a negative recovered share (" .. table.concat(shown, "; ") .. ") means that B with A's activation "
    .. "patched in is further from A than B alone. B's error is not a sum of independent errors, one per layer: "
    .. "the rounding below the patched point (the embedding, the lower layers) partly cancels the rounding above "
    .. "it, so giving B's upper layers A's exact input removes an error that was offsetting theirs. Shares are "
    .. "ratios of small " .. (by_metric and "differences" or "KLs") .. ": read them with the "
    .. (by_metric and "values" or "KL columns") .. " (docs/sweeps.md, compare-models)." }
end

-- format(report) -> the text table `ember compare-models` prints
function M.format(r)
  local out = {}
  local function line(...) out[#out + 1] = string.format(...) end
  line("compare-models: A %s (%s)  B %s (%s)", r.a.path, r.a.dtype, r.b.path, r.b.dtype)
  line("%s, %d layers; %d prompt tokens, %d generated by A (B fed the same tokens); %d evaluations", r.family,
    r.n_layers, #r.prompt_ids, #r.generated_ids, r.evaluations)
  local o = r.output
  line("output divergence of B from A: KL prefill %s, KL decode (mean) %s, top-1 agreement %.0f%%", g(o.kl_prefill),
    g(o.kl_decode), 100 * o.top1_agreement)
  line("")
  line("per-layer divergence            ---------- prefill ----------   ------- decode (mean / worst) -------")
  line("%-16s %5s   %10s %10s %10s   %10s %10s %10s", "stage", "layer", "rel L2", "cosine", "max|d|", "rel L2",
    "min cos", "max|d|")
  for _, row in ipairs(r.divergence) do
    local p, d = row.prefill or {}, row.decode ~= json.null and row.decode or {}
    line("%-16s %5s   %10s %10s %10s   %10s %10s %10s", row.stage, row.layer and tostring(row.layer) or "-",
      g(p.rel_l2 or json.null), g(p.cosine or json.null), g(p.max_abs or json.null), g(d.rel_l2 or json.null),
      g(d.cosine or json.null), g(d.max_abs or json.null))
  end
  line("")
  local by_metric = r.metric and r.metric.kind ~= "kl"
  if by_metric then
    local va, vb = o.metric_a, o.metric_b
    line("metric: %s; A prefill %s, decode %s; B prefill %s, decode %s", r.metric.label, g(va.prefill), g(va.decode),
      g(vb.prefill), g(vb.decode))
    line("causal localisation: A's activation patched into B; share of the gap from B's %s to A's recovered",
      r.metric.kind)
  else
    line("causal localisation: A's activation patched into B; share of B's KL from A recovered")
  end
  -- the columns: stage, layer, KL prefill and decode, (the metric's prefill and decode), the shares, top-1
  local head = { "stage", "layer", "KL prefill", "KL decode", "rec. pre", "rec. dec", "top-1" }
  if by_metric then table.insert(head, 5, "M prefill"); table.insert(head, 6, "M decode") end
  local cols = "%-16s %5s   " .. string.rep("%10s ", #head - 3)
  line(cols .. "%8s", table.unpack(head))
  for _, l in ipairs(r.localisation) do
    local row = { l.stage, l.layer == json.null and "-" or tostring(l.layer), g(l.kl_prefill), g(l.kl_decode),
      g(l.recovered_prefill), g(l.recovered_decode), 100 * l.top1_agreement, l.logits_exact and "  logits exact" or "" }
    if by_metric then table.insert(row, 5, g(l.metric_prefill)); table.insert(row, 6, g(l.metric_decode)) end
    line(cols .. "%7.0f%%%s", table.unpack(row))
  end
  for _, n in ipairs(M.notes(r)) do -- wrapped at 100 columns
    line("")
    local cur = "note:"
    for word in n:gmatch("%S+") do
      if #cur + 1 + #word > 100 then line("%s", cur); cur = "     " .. word else cur = cur .. " " .. word end
    end
    line("%s", cur)
  end
  return table.concat(out, "\n") .. "\n"
end

return M
