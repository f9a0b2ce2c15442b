-- ember.sweep.pairs_cell — what a sweep over many prompt pairs stores: a cell's mean over the
-- pairs, its standard error and each pair's value, and the manifest's `pairs` section (each
-- pair's ids, metric tokens and baselines). Must not run the model: sweep/init.lua computes each
-- pair's cell, this file only folds them, and store.lua writes what it gets.

local json = require("ember.store.json")
local core = require("ember.core")

local M = {}

-- mean_stderr(values) -> the mean (summed in pair order, so the same pairs give the same bits) and
-- the standard error of the mean (sample standard deviation / sqrt(n); null for one pair)
function M.mean_stderr(values)
  local n, sum = #values, 0.0
  for _, v in ipairs(values) do sum = sum + v end
  local mean = sum / n
  if n < 2 then return mean, json.null end
  local ss = 0.0
  for _, v in ipairs(values) do ss = ss + (v - mean) * (v - mean) end
  return mean, math.sqrt(ss / (n - 1) / n)
end

-- aggregate(each, clean_mean, corrupted_mean) -> the fields of one cell over all pairs (each: the
-- pairs' own cells, in pair order). Certified and equals_corrupted hold when they hold for every
-- pair; logits_sha256 and the source's record_sha256 digest the pairs' own, in order; the recovered
-- share is of the means: (mean - corrupted mean) / (clean mean - corrupted mean).
function M.aggregate(each, clean_mean, corrupted_mean)
  local values, shas, sources = json.array(), {}, {}
  local certified, equal = true, true
  for i, c in ipairs(each) do
    values[i] = c.value
    shas[i], sources[i] = c.logits_sha256, c.source_sha256
    certified = certified and c.certified
    equal = equal and c.equals_corrupted
  end
  local f = each[1]
  local mean, stderr = M.mean_stderr(values)
  return { index = f.index, stage = f.stage, layer = f.layer, position = f.position, value = mean, stderr = stderr,
    values = values, clean_value = clean_mean, corrupted_value = corrupted_mean, certified = certified,
    equals_corrupted = equal, logits_sha256 = core.sha256(table.concat(shas, ",")),
    source_sha256 = core.sha256(table.concat(sources, ",")), source_row = f.source_row,
    settings_sha256 = f.settings_sha256 }
end

local function ints(t) return json.array({ table.unpack(t) }) end

local PER_PAIR = { ["logit-diff"] = "logit difference answer - wrong", prob = "probability of the answer",
  logit = "logit of the answer", logprob = "log-probability of the answer" }

-- label(explicit, label1, items) -> the metric's label over the pairs: the one metric when it names
-- its tokens (or takes none), else what each pair's tokens are
local function label(explicit, label1, items)
  local n = #items
  local what = label1
  if #explicit.tokens == 0 and explicit.kind ~= "kl" then
    local named = true
    for _, it in ipairs(items) do
      named = named and it.answer ~= nil and (explicit.kind ~= "logit-diff" or it.wrong ~= nil)
    end
    what = named and PER_PAIR[explicit.kind] or (PER_PAIR[explicit.kind]:gsub("answer %- wrong", "clean top-1 - "
      .. "corrupted top-1"):gsub("the answer", "the clean top-1"))
  end
  return string.format("%s, mean of %d pair%s", what, n, n == 1 and "" or "s")
end

-- section(doc, dataset, units, explicit) -> clean_mean, corrupted_mean. Adds the `pairs` section to
-- the manifest and makes the sweep's baselines the means over the pairs (clean and corrupted keep
-- the first pair's prompts, ids and labels: the figure's tics); settings_sha256 and pairs.sha256
-- then cover every pair.
function M.section(doc, dataset, units, explicit)
  local items, digest = json.array(), json.array()
  local cvals, xvals = {}, {}
  for i, it in ipairs(dataset.items) do
    local u = units[i]
    cvals[i], xvals[i] = u.clean_value, u.corr_value
    local run = function(logits, value) return { logits_sha256 = logits:sha256(), top1 = logits:argmax() - 1,
      value = value } end
    items[i] = { where = it.where, clean_ids = ints(it.clean_ids), corrupted_ids = ints(it.corrupted_ids),
      metric_tokens = ints(u.metric.tokens), clean = run(u.clean_logits, u.clean_value),
      corrupted = run(u.corr_logits, u.corr_value) }
    digest[i] = { items[i].clean_ids, items[i].corrupted_ids, items[i].metric_tokens, items[i].clean.logits_sha256,
      items[i].corrupted.logits_sha256 }
  end
  local clean_mean = M.mean_stderr(cvals)
  local corrupted_mean = M.mean_stderr(xvals)
  local sha = core.sha256(json.encode(digest))
  doc.pairs = { count = #items, file = dataset.file or json.null, sha256 = sha, clean_mean = clean_mean,
    corrupted_mean = corrupted_mean, items = items }
  doc.clean.value, doc.corrupted.value = clean_mean, corrupted_mean
  doc.metric.tokens = ints(explicit.tokens)
  doc.metric.label = label(explicit, doc.metric.label, dataset.items)
  doc.settings_sha256 = core.sha256(doc.settings_sha256 .. "," .. sha)
  return clean_mean, corrupted_mean
end

local function float(v) return type(v) == "number" and v + 0.0 or v end

-- restore(p): a `pairs` section read back from JSON as it was written (whole doubles stay
-- doubles, lists stay lists), so a resumed sweep writes the same bytes
function M.restore(p)
  if type(p) ~= "table" then return end
  p.clean_mean, p.corrupted_mean = float(p.clean_mean), float(p.corrupted_mean)
  if type(p.items) ~= "table" then return end
  json.array(p.items)
  for _, it in ipairs(p.items) do
    for _, k in ipairs({ "clean_ids", "corrupted_ids", "metric_tokens" }) do
      if type(it[k]) == "table" then json.array(it[k]) end
    end
    for _, k in ipairs({ "clean", "corrupted" }) do
      if type(it[k]) == "table" then it[k].value = float(it[k].value) end
    end
  end
end

return M
