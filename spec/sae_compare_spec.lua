-- ember sae compare / ember.sae.compare: the same SAE on one model in f32 and in q8_0 (the tiny
-- llama, one seed): per-feature Pearson correlations and firing-rate shifts against plain float64
-- loops over features computed apart (run_with_cache, sae:encode); a model against itself gives r
-- = 1 for every feature that varies; the command writes the report, the table and the histogram.

local ember = require("ember")
local cjson = require("cjson")
local cases = require("helpers.sae_cases")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")
local H = require("helpers.artifacts")
local files = require("helpers.files")

local PROMPTS = { "The quick brown fox jumps", "over the lazy dog", "and then it ran away" }
local LAYER = 1

local function features(model, sae)
  local rows = {}
  for _, p in ipairs(PROMPTS) do
    local ids = model:tokenize(p)
    local x = model:run_with_cache { ids = ids, stages = { "after_layer" }, layers = { LAYER } }.after_layer[LAYER]
    local f = sae:encode(x)
    for r = 1, #ids do
      local row = {}
      for j = 1, sae.d_sae do row[j] = f:get(r, j) end
      rows[#rows + 1] = row
    end
  end
  return rows
end

local function pearson(a, b, j)
  local n, ma, mb = #a, 0, 0
  for r = 1, n do ma, mb = ma + a[r][j] / n, mb + b[r][j] / n end
  local sab, saa, sbb = 0, 0, 0
  for r = 1, n do
    local da, db = a[r][j] - ma, b[r][j] - mb
    sab, saa, sbb = sab + da * db, saa + da * da, sbb + db * db
  end
  if saa == 0 or sbb == 0 then return nil end
  return sab / math.sqrt(saa * sbb)
end

local function prompts() local out = {} for i, p in ipairs(PROMPTS) do out[i] = { text = p } end return out end

describe("ember.sae.compare", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("correlates each feature with the reference model's as plain loops do", function()
    local a_path, why = fx.tiny_model("--family llama --dtype f32 --seed 7")
    local b_path = fx.tiny_model("--family llama --dtype q8_0 --seed 7")
    if not a_path or not b_path then return pending("make-tiny-model: " .. tostring(why)) end
    local e = cases.copy("saelens_standard_v6")
    local sae = ember.sae.load(e.sae)
    local cmp = require("ember.sae.compare")
    local res = cmp.run { models = { a_path, b_path, a_path }, sae = sae, prompts = prompts(),
      load = function(p) return ember.load { model = p } end }
    local ma, mb = ember.load { model = a_path }, ember.load { model = b_path }
    local fa, fb = features(ma, sae), features(mb, sae)
    local sm = res.models[2].summary
    local defined = 0
    for j = 1, sae.d_sae do
      local r = pearson(fa, fb, j)
      if r then
        defined = defined + 1
        assert(math.abs(sm.correlation[j] - r) < 1e-9, string.format("feature %d: %.12g vs %.12g", j - 1,
          sm.correlation[j], r))
      else
        assert(sm.correlation[j] ~= sm.correlation[j], "feature " .. (j - 1) .. " should have no correlation")
      end
      local ca, cb = 0, 0
      for r2 = 1, #fa do
        if fa[r2][j] > 0 then ca = ca + 1 end
        if fb[r2][j] > 0 then cb = cb + 1 end
      end
      assert.are.equal((cb - ca) / #fa, sm.fire_shift[j])
    end
    assert.are.equal(defined, sm.defined)
    local moved = false -- q8_0 moves the activations a little: some r is below 1
    for j = 1, sae.d_sae do moved = moved or sm.correlation[j] < 1 - 1e-12 end
    assert.is_true(moved)
    -- the reference against itself: every varying feature at r = 1
    local self = res.models[3].summary
    assert.are.equal(defined > 0 and self.defined or 0, self.defined)
    for j = 1, sae.d_sae do
      local c = self.correlation[j]
      assert(c ~= c or math.abs(c - 1) < 1e-9, "self-correlation " .. tostring(c))
    end
    assert.are.same({ 1, 1, 1 }, self.share)
    assert.are.equal(0, self.mean_abs_fire_shift)
  end)
end)

describe("ember.sae.compare.histogram", function()
  it("counts r below 0 in one bin and [0, 1] in equal bins, 1 in the last", function()
    local h = require("ember.sae.compare").histogram({ -0.5, 0, 0.949, 0.95, 1, 0 / 0 }, 20)
    assert.are.equal(21, #h)
    assert.are.same({ 1, 1, 1, 2 }, { h[1], h[2], h[20], h[21] })
    local total = 0
    for _, c in ipairs(h) do total = total + c end
    assert.are.equal(5, total) -- the NaN (a feature that does not vary) is left out
  end)
end)

describe("ember sae compare", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("prints the table and writes report.json, table.txt and the histogram", function()
    local a_path = fx.tiny_model("--family llama --dtype f32 --seed 7")
    local b_path = fx.tiny_model("--family llama --dtype q8_0 --seed 7")
    if not a_path or not b_path then return pending("make-tiny-model is not built") end
    local e = cases.copy("saelens_standard_v6")
    local dir = H.tmpdir()
    local lines = {}
    for i, p in ipairs(PROMPTS) do lines[i] = cjson.encode({ prompt = p }) end
    H.write(dir .. "/p.jsonl", table.concat(lines, "\n") .. "\n")
    local code, out, err = C.ember("sae", "compare", "--sae", e.sae, "--models", a_path, b_path, "--prompts",
      dir .. "/p.jsonl", "--out", dir .. "/cmp")
    assert.are.equal(0, code, err)
    assert.matches("median r", out)
    assert.matches("%(ref%)", out)
    local doc = cjson.decode(files.read(dir .. "/cmp/report.json"))
    assert.are.equal("sae compare", doc.command)
    assert.are.equal(2, #doc.models)
    assert.is_true(doc.models[1].reference)
    assert.are.equal(256, #doc.models[2].correlation)
    assert.is_not_nil(doc.models[2].share_above["0.9"])
    assert.are.equal(out:match("\n(model.*)$"), files.read(dir .. "/cmp/table.txt"))
    if require("ember.analysis.plot").gnuplot() then
      assert.is_true(#files.read(dir .. "/cmp/correlations.svg") > 0)
    end
    code, _, err = C.ember("sae", "compare", "--sae", e.sae, "--models", a_path, "--prompts", dir .. "/p.jsonl")
    assert.are.equal(2, code)
    assert.matches("at least two models", err)
  end)
end)
