-- ember.sae.compare — which of an SAE's features survive a change of weights (f32 -> q8_0 ->
-- q4_k_m ...): the same tokens through each model, each model's features against the first's. Per
-- feature the Pearson correlation of its activations over every token and the shift of its firing
-- rate; per model the share of features above 0.9 / 0.7 / 0.5 and the SAE's own evaluation there
-- (spliced KL, CE, FVE: ember.sae.eval). Must not parse flags or draw (cli/sae.lua does).

local core = require("ember.core")

local M = {}

M.THRESHOLDS = { 0.9, 0.7, 0.5 }

local function fail(msg, ...) error("sae compare: " .. string.format(msg, ...), 0) end

-- Pearson r of feature i from the paired sums (NaN when either side does not vary).
local function pearson(r, i)
  local n = r.rows
  local sa, sb, saa, sbb, sab = r.sum[i], r.sum_b[i], r.sumsq[i], r.sumsq_b[i], r.sum_ab[i]
  local va, vb = n * saa - sa * sa, n * sbb - sb * sb
  if not (va > 0 and vb > 0) then return 0 / 0 end
  return (n * sab - sa * sb) / math.sqrt(va * vb)
end

local function median(list)
  local t = {}
  for _, v in ipairs(list) do if v == v then t[#t + 1] = v end end
  if #t == 0 then return 0 / 0 end
  table.sort(t)
  return #t % 2 == 1 and t[(#t + 1) // 2] or (t[#t // 2] + t[#t // 2 + 1]) / 2
end

-- The per-model summary of one comparison against the reference's features.
local function summary(r, n_features)
  local corr, shift, defined, above = {}, {}, 0, {}
  for k = 1, #M.THRESHOLDS do above[k] = 0 end
  local abs_shift = 0.0
  for i = 1, n_features do
    local c = pearson(r, i)
    corr[i] = c
    shift[i] = (r.count_b[i] - r.count[i]) / r.rows
    abs_shift = abs_shift + math.abs(shift[i])
    if c == c then
      defined = defined + 1
      for k, t in ipairs(M.THRESHOLDS) do if c >= t then above[k] = above[k] + 1 end end
    end
  end
  local share = {}
  for k = 1, #M.THRESHOLDS do share[k] = defined > 0 and above[k] / defined or 0 / 0 end
  return { correlation = corr, fire_shift = shift, defined = defined, median = median(corr), above = above,
    share = share, mean_abs_fire_shift = abs_shift / n_features }
end

-- run{ models = { paths }, load = function(path) -> model, sae = SAE (its own compute: one SAE for
--   every model), prompts = { { text } }, on_model = function(i, path, eval_overall) } ->
-- { models = { { path, info, eval = overall, summary (nil for the first) } }, tokens }
-- The prompts are tokenized by the first model; every other model must give the same ids.
function M.run(o)
  if #o.models < 2 then fail("give at least two models (the first is the reference)") end
  local eval = require("ember.sae.eval")
  local ref_f, ids_of, out, tokens = {}, {}, {}, 0
  for m, path in ipairs(o.models) do
    local model = o.load(path)
    local prompts = {}
    for i, p in ipairs(o.prompts) do
      local ids = model:tokenize(p.text)
      if m == 1 then
        ids_of[i] = ids
        tokens = tokens + #ids
      elseif table.concat(ids, ",") ~= table.concat(ids_of[i], ",") then
        model:close()
        fail("%s tokenizes prompt %d otherwise than %s (the models must share a tokenizer)", path, i - 1,
          o.models[1])
      end
      prompts[i] = { text = p.text, ids = ids }
    end
    local stats = m > 1 and core.sae_stats(o.sae.d_sae) or nil
    local res = eval.run { model = model, sae = o.sae, prompts = prompts, on_features = function(i, f)
      if m == 1 then ref_f[i] = f else stats:add(ref_f[i], f) end
    end }
    local entry = { path = path, info = model.info, eval = res.overall, features = res.features }
    if stats then entry.summary = summary(stats:result(), o.sae.d_sae) end
    out[m] = entry
    if o.on_model then o.on_model(m, path, entry) end
    model:close()
  end
  return { models = out, tokens = tokens }
end

-- histogram(corr, bins) -> counts of the defined correlations: one bin below 0, then `bins` equal
-- bins over [0, 1] (the last one closed), where surviving features are told apart.
function M.histogram(corr, bins)
  local counts = {}
  for b = 1, bins + 1 do counts[b] = 0 end
  for _, c in ipairs(corr) do
    if c == c then
      local b = c < 0 and 1 or math.min(bins - 1, math.floor(c * bins)) + 2
      counts[b] = counts[b] + 1
    end
  end
  return counts
end

return M
