-- ember sae eval / ember.sae.eval: the measures against an independent computation. An SAE that
-- reconstructs exactly (x = relu(x) - relu(-x)) gives zero KL, no CE change and all the variance
-- explained, with L0, dead and dense counts that plain sign counting of the captured activations
-- predicts; a random SAE's KL, CE (plain, spliced, zeroed), L0 and FVE equal plain float64 loops
-- over logits and activations taken from separate runs; the command prints and writes the report.

local ember = require("ember")
local cjson = require("cjson")
local cases = require("helpers.sae_cases")
local C = require("helpers.cli")
local H = require("helpers.artifacts")
local files = require("helpers.files")

local PROMPTS = { "The quick brown fox jumps", "over the lazy dog and then some" }
local LAYER = 1

local function prompt_list(model)
  local out = {}
  for i, p in ipairs(PROMPTS) do out[i] = { text = p, ids = model:tokenize(p) } end
  return out
end

-- log-softmax of a row (a Lua list) in double
local function log_softmax(row)
  local m = -math.huge
  for _, v in ipairs(row) do if v > m then m = v end end
  local s = 0.0
  for _, v in ipairs(row) do s = s + math.exp(v - m) end
  local out, lse = {}, m + math.log(s)
  for j, v in ipairs(row) do out[j] = v - lse end
  return out
end

local function rows_of(t)
  local rows, cols = table.unpack(t:shape())
  local v, out = t:values(), {}
  for r = 1, rows do out[r] = table.move(v, (r - 1) * cols + 1, r * cols, 1, {}) end
  return out
end

-- The expected measures of one prompt, by plain loops.
local function expected(model, sae, ids)
  local function logits(opts)
    local o = { ids = ids, max_tokens = 0, all_logits = true }
    for k, v in pairs(opts) do o[k] = v end
    return rows_of(model:generate(o).prompt_logits)
  end
  local zero = { name = "zero" }
  function zero:after_layer(ctx, v) if ctx.layer_index == LAYER then v:zero() end end
  local clean, spliced = logits {}, logits { sae = sae, splice = "reconstruction" }
  local zeroed = logits { experiment = zero }
  local function ce(rows)
    local s = 0.0
    for i = 1, #ids - 1 do s = s - log_softmax(rows[i])[ids[i + 1] + 1] end
    return s / (#ids - 1)
  end
  local kl = 0.0
  for i = 1, #ids do
    local lp, lq = log_softmax(clean[i]), log_softmax(spliced[i])
    for j = 1, #lp do kl = kl + math.exp(lp[j]) * (lp[j] - lq[j]) end
  end
  local x = model:run_with_cache { ids = ids, stages = { "after_layer" }, layers = { LAYER } }.after_layer[LAYER]
  local xs, hs = rows_of(x), rows_of(sae:decode(sae:encode(x), x))
  local fs = rows_of(sae:encode(x))
  local n, d = #xs, #xs[1]
  local rss, mean, tss, l0 = 0.0, {}, 0.0, 0
  for j = 1, d do
    mean[j] = 0.0
    for r = 1, n do mean[j] = mean[j] + xs[r][j] / n end
  end
  for r = 1, n do
    for j = 1, d do
      rss = rss + (xs[r][j] - hs[r][j]) ^ 2
      tss = tss + (xs[r][j] - mean[j]) ^ 2
    end
    for _, v in ipairs(fs[r]) do if v > 0 then l0 = l0 + 1 end end
  end
  return { kl = kl / #ids, ce_clean = ce(clean), ce_spliced = ce(spliced), ce_zero = ce(zeroed), l0 = l0 / n,
    fve = 1 - rss / tss, fs = fs }
end

local function near(a, b, tol, what)
  assert(math.abs(a - b) <= tol * math.max(1, math.abs(b)), string.format("%s: %.9g vs %.9g", what, a, b))
end

describe("ember.sae.eval", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("finds nothing lost by an SAE that reconstructs exactly, and counts its features", function()
    local path = C.need_model()
    if not path then return end
    local model = ember.load { model = path }
    local e = cases.copy("saelens_identity")
    local sae = ember.sae.load(e.sae, { model = model })
    local prompts = prompt_list(model)
    local res = require("ember.sae.eval").run { model = model, sae = sae, prompts = prompts }
    assert.are.equal(0, res.overall.kl)
    assert.are.equal(0, res.overall.ce_delta)
    assert.are.equal(1, res.overall.fve)
    -- features 0-63 fire where x > 0, 64-127 where x < 0, 128-255 never
    local fired, tokens = {}, 0
    for i, p in ipairs(prompts) do
      local x = model:run_with_cache { ids = p.ids, stages = { "after_layer" }, layers = { LAYER } }.after_layer[LAYER]
      local l0 = 0
      for _, row in ipairs(rows_of(x)) do
        tokens = tokens + 1
        for j, v in ipairs(row) do
          if v > 0 then fired[j] = (fired[j] or 0) + 1; l0 = l0 + 1 end
          if v < 0 then fired[64 + j] = (fired[64 + j] or 0) + 1; l0 = l0 + 1 end
        end
      end
      assert.are.equal(l0 / #p.ids, res.prompts[i].l0)
    end
    local dead, dense = 0, 0
    for j = 1, 256 do
      if not fired[j] then dead = dead + 1 end
      if (fired[j] or 0) / tokens > 0.1 then dense = dense + 1 end
    end
    assert.is_true(dead >= 128)
    assert.are.same({ dead, dense }, { res.features.dead, res.features.dense })
  end)

  it("measures KL, CE, L0 and FVE as plain loops over separate runs do", function()
    local path = C.need_model()
    if not path then return end
    local model = ember.load { model = path }
    local e = cases.copy("saelens_standard_v6")
    local sae = ember.sae.load(e.sae, { model = model })
    local prompts = prompt_list(model)
    local res = require("ember.sae.eval").run { model = model, sae = sae, prompts = prompts }
    for i, p in ipairs(prompts) do
      local want, got = expected(model, sae, p.ids), res.prompts[i]
      near(got.kl, want.kl, 1e-5, "kl")
      near(got.ce_clean, want.ce_clean, 1e-5, "ce_clean")
      near(got.ce_spliced, want.ce_spliced, 1e-5, "ce_spliced")
      near(got.ce_zero, want.ce_zero, 1e-5, "ce_zero")
      near(got.fve, want.fve, 1e-5, "fve")
      assert.are.equal(want.l0, got.l0)
      assert.is_true(got.kl > 0 and got.fve < 1)
    end
  end)
end)

describe("ember sae eval", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("prints a table, and the JSON report to stdout and --out", function()
    local path = C.need_model()
    if not path then return end
    local e = cases.copy("saelens_standard_v6")
    local dir = H.tmpdir()
    local list = {}
    for i, p in ipairs(PROMPTS) do list[i] = cjson.encode({ prompt = p }) end
    H.write(dir .. "/p.jsonl", table.concat(list, "\n") .. "\n")
    local code, out, err = C.ember("sae", "eval", "--model", path, "--sae", e.sae, "--prompts", dir .. "/p.jsonl",
      "--out", dir .. "/r.json")
    assert.are.equal(0, code, err)
    assert.matches("prompt  tokens +KL", out)
    assert.matches("\nall ", out)
    assert.matches("features: %d+ dead, %d+ dense", out)
    local doc = cjson.decode(files.read(dir .. "/r.json"))
    assert.are.equal("sae eval", doc.command)
    assert.are.equal(2, #doc.per_prompt)
    assert.are.equal(2, doc.prompts.count)
    code, out = C.ember("sae", "eval", "--model", path, "--sae", e.sae, "--prompts", dir .. "/p.jsonl", "--json")
    assert.are.equal(0, code)
    assert.are.same(doc.overall, cjson.decode(out).overall)
    code, _, err = C.ember("sae", "eval", "--model", path, "--prompts", dir .. "/p.jsonl")
    assert.are.equal(2, code)
    assert.matches("%-%-sae is required", err)
  end)
end)
