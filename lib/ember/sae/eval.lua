-- ember.sae.eval — how well an SAE stands in for the activation it reads, over a set of prompts:
-- the model's loss with the SAE's reconstruction spliced in against the plain model (KL, CE), the
-- sparsity of its features (L0, dead and dense features) and the variance of the activation its
-- reconstruction explains; per prompt and overall (docs/sae.md, "Evaluating an SAE"). Must not parse
-- flags or print (cli/sae.lua does).

local core = require("ember.core")

local M = {}

M.DENSE_THRESHOLD = 0.1

local function add(a, b) return core.add(a, b) end

-- The stage (and layer) an SAE writes (a transcoder: its output stage).
local function out_site(entry) return entry.out end

-- One prefill of ids (no token generated) with the given generate options; every position's logits.
local function prefill(model, ids, opts)
  local o = { ids = ids, max_tokens = 0, all_logits = true }
  for k, v in pairs(opts) do o[k] = v end
  local out = model:generate(o)
  return out.prompt_logits, out
end

-- An experiment that keeps the SAE's input (x), its output stage's activation (y: the target a
-- transcoder's reconstruction is measured against) and the features, of the prefill.
local function grab(entry)
  local e = { name = "sae-eval-grab" }
  local site, out = entry.site, out_site(entry)
  e[site.stage] = function(_, ctx, v)
    if ctx.phase == "prefill" and ctx.layer_index == site.layer then e.x = v:clone() end
  end
  if out.stage ~= site.stage or out.layer ~= site.layer then
    e[out.stage] = function(_, ctx, v)
      if ctx.phase == "prefill" and ctx.layer_index == out.layer then e.y = v:clone() end
    end
  end
  e.sae_features = function(_, ctx, f) if ctx.phase == "prefill" then e.f = f:clone() end end
  return e
end

-- The experiment that zeroes what the SAE writes: the loss with nothing there (the CE score's floor).
local function zero(entry)
  local out = out_site(entry)
  local e = { name = "sae-eval-zero" }
  e[out.stage] = function(_, ctx, v) if ctx.layer_index == out.layer then v:zero() end end
  return e
end

-- Per-row KL(p || q) of two [n, V] logit tensors, as a list.
local function kl_rows(p_logits, q_logits)
  local lp, lq = p_logits:log_softmax(), q_logits:log_softmax()
  local rows = core.mul(p_logits:softmax(), core.sub(lp, lq)):transpose():sum():values()
  return rows, lp, lq
end

-- Mean next-token cross-entropy of positions 1 .. n-1 (0-based position i predicts ids[i + 2]).
local function ce(lp, ids)
  local s = 0.0
  for i = 1, #ids - 1 do s = s - lp:get(i, ids[i + 1] + 1) end
  return #ids > 1 and s / (#ids - 1) or 0 / 0
end

local function max(list)
  local m = -math.huge
  for _, v in ipairs(list) do if v > m then m = v end end
  return m
end

local function mean(list)
  local s = 0.0
  for _, v in ipairs(list) do s = s + v end
  return #list > 0 and s / #list or 0 / 0
end

-- Sums for the variance explained: over rows r of target t and reconstruction h, RSS = sum |t - h|^2,
-- and the target's sum and sum of squares (so TSS = sumsq - |sum|^2 / n can be pooled later).
local function variance_sums(t, h)
  local diff = core.sub(t, h)
  local rss = diff:l2_norm() ^ 2
  local sum = t:sum()
  return { rss = rss, sumsq = t:l2_norm() ^ 2, sum = sum, n = t:shape()[1] }
end

local function fve(v)
  local s2 = v.sum:l2_norm() ^ 2
  local tss = v.sumsq - s2 / v.n
  return 1 - v.rss / tss
end

-- one(model, entry, ids) -> per-prompt report and what the totals need
local function one(model, entry, ids, stats)
  local g = grab(entry)
  local clean = prefill(model, ids, { sae = { { sae = entry.sae, splice = "error" } }, experiment = g })
  local spliced = prefill(model, ids, { sae = { { sae = entry.sae, splice = "reconstruction" } } })
  local zeroed = prefill(model, ids, { experiment = zero(entry) })
  local kl, lp_clean, lp_spliced = kl_rows(clean, spliced)
  local _, _, lp_zero = kl_rows(clean, zeroed)
  local ce_clean, ce_spliced, ce_zero = ce(lp_clean, ids), ce(lp_spliced, ids), ce(lp_zero, ids)
  local target = g.y or g.x
  local recon = entry.sae:decode(g.f, g.x)
  local l0 = stats:add(g.f)
  local v = variance_sums(target, recon)
  return {
    tokens = #ids, kl = mean(kl), kl_max = max(kl), ce_clean = ce_clean, ce_spliced = ce_spliced,
    ce_zero = ce_zero, ce_delta = ce_spliced - ce_clean,
    ce_score = (ce_zero - ce_spliced) / (ce_zero - ce_clean),
    l0 = mean(l0), fve = fve(v), mse = v.rss / (v.n * target:shape()[2]),
    cosine = core.cosine(target, recon),
  }, v, kl, g.f
end

-- run{ model =, sae = SAE, prompts = { { ids = {...}, text = s }, ... }, dense_threshold = 0.1,
--   on_prompt = function(i, report), on_features = function(i, f) (the plain run's features of
--   prompt i, [tokens, d_sae]) } -> { prompts = { per-prompt reports }, overall = {...},
--   features = { dead, dense, d_sae, fire_rate = {...} } }
-- Every prompt is three prefills: plain (the SAE attached, unedited: bit-identical to no SAE), with
-- the reconstruction spliced in, and with the SAE's output stage zeroed.
function M.run(opts)
  local model, sae = opts.model, opts.sae
  local sites = require("ember.sae.splice").sites(sae, model, "error", "sae eval")
  local entry = sites.list[1]
  local stats = core.sae_stats(sae.d_sae)
  local reports, totals, kl_all, tokens = {}, nil, {}, 0
  local ce_sum = { clean = 0.0, spliced = 0.0, zero = 0.0, n = 0 }
  for i, p in ipairs(opts.prompts) do
    local r, v, kl, f = one(model, entry, p.ids, stats)
    if opts.on_features then opts.on_features(i, f) end
    r.text = p.text
    reports[i] = r
    if totals then
      totals.rss, totals.sumsq, totals.n = totals.rss + v.rss, totals.sumsq + v.sumsq, totals.n + v.n
      totals.sum = add(totals.sum, v.sum)
    else
      totals = v
    end
    for _, k in ipairs(kl) do kl_all[#kl_all + 1] = k end
    local w = #p.ids - 1 -- CE averages over the predicted positions
    ce_sum.clean, ce_sum.spliced = ce_sum.clean + r.ce_clean * w, ce_sum.spliced + r.ce_spliced * w
    ce_sum.zero, ce_sum.n = ce_sum.zero + r.ce_zero * w, ce_sum.n + w
    tokens = tokens + #p.ids
    if opts.on_prompt then opts.on_prompt(i, r) end
  end
  local res = stats:result()
  local threshold = opts.dense_threshold or M.DENSE_THRESHOLD
  local dead, dense, rate = 0, 0, {}
  for i = 1, sae.d_sae do
    rate[i] = res.count[i] / res.rows
    if res.count[i] == 0 then dead = dead + 1 end
    if rate[i] > threshold then dense = dense + 1 end
  end
  local l0 = 0.0
  for i = 1, sae.d_sae do l0 = l0 + res.count[i] end
  local c_clean, c_spliced, c_zero = ce_sum.clean / ce_sum.n, ce_sum.spliced / ce_sum.n, ce_sum.zero / ce_sum.n
  return {
    prompts = reports,
    overall = { prompts = #reports, tokens = tokens, kl = mean(kl_all), ce_clean = c_clean, ce_spliced = c_spliced,
      ce_zero = c_zero, ce_delta = c_spliced - c_clean, ce_score = (c_zero - c_spliced) / (c_zero - c_clean),
      l0 = l0 / res.rows, fve = totals and fve(totals) or 0 / 0 },
    features = { d_sae = sae.d_sae, dead = dead, dense = dense, dense_threshold = threshold, fire_rate = rate },
  }
end

return M
