-- ember.attribute (attribution patching) against exact patching: each score is the derivative of
-- the patched metric along (a_clean - a_corrupted) (central differences of partial patches, on
-- the reference kernels), the resid scores against a full ember.sweep grid of the same cells (the
-- spec reports Spearman's rho), verify's exact patches equal to the sweep's cells, and bad input.

local ember = require("ember")
local attribute = require("ember.analysis.attribute")
local fx = require("helpers.fixtures")

local CLEAN = { 1, 17, 40, 3, 99, 250 }
local CORRUPTED = { 1, 17, 41, 3, 99, 250 }

local function tiny(family)
  local path, why = fx.tiny_model("--family " .. family .. " --dtype f32 --layers 3 --seed 11")
  if not path then pending(why) end
  return path
end

describe("ember.attribute", function()
  it("each score is the derivative of patching a fraction of the clean activation in (llama, gpt2)", function()
    for _, family in ipairs({ "llama", "gpt2" }) do
      local m = ember.load { model = tiny(family), kernels = "reference" }
      local r = ember.attribute { model = m, clean = CLEAN, corrupted = CORRUPTED, metric = "logit-diff:3,7" }
      assert.are.equal(3 * (m.info.n_heads + 1) * #CLEAN + 3 * #CLEAN * r.units.neurons, #r.ranked)
      local seen, h = {}, 1e-2
      for _, e in ipairs(r.ranked) do -- the two largest of each kind
        seen[e.component] = (seen[e.component] or 0) + 1
        if seen[e.component] <= 2 then
          local fd = (attribute.patch(m, r, e, h) - attribute.patch(m, r, e, -h)) / (2 * h)
          local err = math.abs(fd - e.score) / math.abs(r.ranked[1].score)
          assert.is_true(err <= 1e-3, string.format("%s %s layer %d unit %d position %d: AtP %.6g, derivative %.6g",
            family, e.component, e.layer, e.index, e.position, e.score, fd))
        end
      end
      assert.are.same({ heads = 2, neurons = 2, resid = 2 },
        { heads = math.min(seen.heads, 2), neurons = math.min(seen.neurons, 2), resid = math.min(seen.resid, 2) })
    end
  end)

  it("resid scores against exact patching of every cell of the sweep grid (rho reported)", function()
    local m = ember.load { model = tiny("llama") }
    local r = ember.attribute { model = m, clean = CLEAN, corrupted = CORRUPTED, metric = "logit-diff:3,7",
      components = "resid", verify = 3 }
    local sweep = ember.sweep { model = m, clean = CLEAN, corrupted = CORRUPTED, metric = "logit-diff:3,7" }
    assert.are.equal(r.corrupted_value, sweep.manifest.corrupted.value)
    assert.are.equal(r.clean_value, sweep.manifest.clean.value)
    local by = {}
    for _, c in ipairs(sweep.cells) do by[c.layer .. ":" .. c.position] = c.value end
    local est, exact = {}, {}
    for _, e in ipairs(r.ranked) do
      est[#est + 1], exact[#exact + 1] = e.estimate, by[e.layer .. ":" .. e.position]
      if e.position < 2 then -- the prompts agree there: nothing to patch, nothing estimated
        assert.are.equal(0, e.score)
        assert.are.equal(r.corrupted_value, by[e.layer .. ":" .. e.position])
      end
    end
    assert.are.equal(#sweep.cells, #est)
    local rho = attribute.spearman(est, exact)
    print(string.format("\nAtP vs exact patching, resid after_layer, %d cells: Spearman rho = %.3f", #est, rho))
    -- a random tiny model's residual differences are large: AtP's linearization of the final norm is
    -- far off at the last cells (docs/attribution.md), so only the sign of the agreement is asserted
    assert.is_true(rho > 0, "rho " .. rho)
    for _, e in ipairs(r.verify.checked) do -- verify's patch is the sweep's, bit for bit
      assert.are.equal(by[e.layer .. ":" .. e.position], e.exact)
    end
  end)

  it("head scores against exact patching of every head at every position (rho reported)", function()
    local m = ember.load { model = tiny("llama") }
    local r = ember.attribute { model = m, clean = CLEAN, corrupted = CORRUPTED, metric = "logprob:3",
      components = "heads" }
    local est, exact = {}, {}
    for _, e in ipairs(r.ranked) do
      est[#est + 1], exact[#exact + 1] = e.score, attribute.patch(m, r, e) - r.corrupted_value
    end
    assert.are.equal(3 * m.info.n_heads * #CLEAN, #est)
    local rho = attribute.spearman(est, exact)
    print(string.format("\nAtP vs exact patching, %d head cells: Spearman rho = %.3f", #est, rho))
    assert.is_true(rho > 0.5, "rho " .. rho)
  end)

  it("top = N keeps the N largest of the full ranking, in its order; the grids hold every score", function()
    local m = ember.load { model = tiny("llama") }
    local opts = { model = m, clean = CLEAN, corrupted = CORRUPTED, metric = "logit-diff:3,7", top = "all" }
    local all = ember.attribute(opts)
    opts.top = 7
    local few = ember.attribute(opts)
    assert.are.equal(7, #few.ranked)
    assert.are.equal(#all.ranked, few.total)
    for i = 1, 7 do
      for _, k in ipairs({ "component", "layer", "index", "position", "score" }) do
        assert.are.equal(all.ranked[i][k], few.ranked[i][k])
      end
    end
    for i = 2, #all.ranked do assert.is_true(math.abs(all.ranked[i - 1].score) >= math.abs(all.ranked[i].score)) end
    local e = all.ranked[#all.ranked]
    assert.are.equal(e.score, all.scores[e.component]:get(e.layer * all.units[e.component] + e.index + 1,
      e.position + 1))
  end)

  it("over a dataset of pairs: the mean of each pair's scores; verify's effects the mean of each pair's", function()
    local m = ember.load { model = tiny("llama"), kernels = "reference" }
    local P = { { clean = CLEAN, corrupted = CORRUPTED, answer = 3, wrong = 7 },
      { clean = { 1, 20, 41, 8, 99, 251 }, corrupted = { 1, 20, 44, 8, 99, 252 }, answer = 3, wrong = 7 } }
    local r = ember.attribute { model = m, pairs = P, components = "heads,resid", verify = 3 }
    assert.equal(2, r.count)
    local singles = {}
    for i, p in ipairs(P) do
      singles[i] = ember.attribute { model = m, clean = p.clean, corrupted = p.corrupted, metric = "logit-diff:3,7",
        components = "heads,resid", top = "all" }
    end
    for _, c in ipairs({ "heads", "resid" }) do
      local mean = (singles[1].scores[c] + singles[2].scores[c]) * 0.5
      assert.equal(mean:bytes(), r.scores[c]:bytes(), c)
    end
    assert.equal((singles[1].corrupted_value + singles[2].corrupted_value) / 2, r.corrupted_value)
    for i = 2, #r.ranked do assert.is_true(math.abs(r.ranked[i - 1].score) >= math.abs(r.ranked[i].score)) end
    assert.equal(6, #r.verify.checked)
    for _, e in ipairs(r.verify.checked) do
      local want = 0.0
      for _, s in ipairs(singles) do want = want + (attribute.patch(m, s, e) - s.corrupted_value) end
      assert.equal(want / 2, e.effect)
    end
  end)

  it("spearman: average ranks for ties (a hand-computed value)", function()
    -- ranks 1..5 against 1, 2, 3.5, 5, 3.5: sum dx dy = 8, sum dx^2 = 10, sum dy^2 = 9.5
    assert.is_true(math.abs(attribute.spearman({ 1, 2, 3, 4, 5 }, { 5, 6, 7, 8, 7 }) - 8 / math.sqrt(95)) < 1e-12)
    assert.is_nil(attribute.spearman({ 1, 2 }, { 3, 3 }))
  end)

  it("refuses bad input by name", function()
    local m = ember.load { model = tiny("llama") }
    local function refuses(opts, pattern)
      opts.model = m
      local ok, err = pcall(ember.attribute, opts)
      assert.is_false(ok)
      assert.matches(pattern, tostring(err))
    end
    refuses({ clean = CLEAN, corrupted = { 1, 2 }, metric = "logit:3" }, "patching by position needs equal lengths")
    refuses({ clean = CLEAN, corrupted = CORRUPTED, metric = "logit:3", components = "layers" },
      "unknown component 'layers'")
    refuses({ clean = CLEAN, corrupted = CORRUPTED, metric = "logit:99999" }, "outside the vocabulary")
    refuses({ clean = CLEAN, corrupted = CORRUPTED, metric = "logit:3", verify = 0 }, "verify must be a positive")
  end)
end)

describe("ember attribute (the CLI)", function()
  local C = require("helpers.cli")
  local H = require("helpers.artifacts")
  local plot = require("ember.analysis.plot")
  after_each(H.cleanup)

  it("writes the report, every score and the heatmaps; --verify reports rho and the exact patches", function()
    if not plot.gnuplot() then pending("gnuplot is not installed (Debian: gnuplot-nox)") end
    local path = tiny("llama")
    local dir = H.tmpdir() .. "/atp"
    local code, out, err = C.ember("attribute", "--model", path, "--clean", "the cat sat", "--corrupted",
      "the dog sat", "--metric", "logprob:5", "--verify", "3", "--top", "4", "--out", dir)
    assert.are.equal(0, code, err)
    local _, lines = out:gsub("\n", "")
    assert.are.equal(4, lines)
    assert.matches("verified 6 components: Spearman rho", err)
    local doc = require("cjson").decode(require("ember.store.fs").read(dir .. "/attribute.json", "report", 1 << 24))
    local m = ember.load { model = path }
    local r = ember.attribute { model = m, clean = "the cat sat", corrupted = "the dog sat", metric = "logprob:5",
      verify = 3 }
    assert.are.equal(r.corrupted_value, doc.corrupted_value)
    assert.are.equal(4, #doc.top)
    assert.are.equal(r.ranked[1].score, doc.top[1].score)
    assert.are.equal(6, #doc.verify.checked)
    assert.are.equal(r.verify.checked[1].exact, doc.verify.checked[1].exact)
    local t = ember.load_tensors(dir .. "/scores.safetensors")
    for _, c in ipairs({ "heads", "neurons", "resid" }) do assert.are.equal(r.scores[c]:bytes(), t[c]:bytes(), c) end
    for _, f in ipairs(doc.plots) do assert.is_true(require("ember.store.fs").exists(dir .. "/" .. f.png), f.png) end
    assert.are.equal(2, #doc.plots) -- heads and resid; neurons only in the safetensors
  end)

  it("--pairs FILE: the dataset's mean scores (those of ember.attribute over the same pairs)", function()
    local path = tiny("llama")
    local dir = H.tmpdir()
    local f = assert(io.open(dir .. "/pairs.jsonl", "w"))
    f:write('{"clean": [1, 17, 40, 3], "corrupted": [1, 17, 41, 3], "answer": 3, "wrong": 7}\n',
      '{"clean": [1, 20, 41, 8], "corrupted": [1, 20, 44, 8], "answer": 3, "wrong": 7}\n')
    f:close()
    local code, out, err = C.ember("attribute", "--model", path, "--pairs", dir .. "/pairs.jsonl", "--top", "3",
      "--out", dir .. "/atp", "--components", "heads")
    assert.are.equal(0, code, err)
    local doc = require("cjson").decode(require("ember.store.fs").read(dir .. "/atp/attribute.json", "report", 1 << 24))
    assert.are.equal(2, doc.pairs.count)
    local r = ember.attribute { model = ember.load { model = path }, pairs = dir .. "/pairs.jsonl",
      components = "heads" }
    assert.are.equal(r.ranked[1].score, doc.top[1].score)
    assert.matches(string.format("%.6g", r.ranked[1].score), out, 1, true)
    code, _, err = C.ember("attribute", "--model", path, "--pairs", dir .. "/pairs.jsonl", "--clean", "a")
    assert.are.equal(2, code)
    assert.matches("%-%-pairs replaces %-%-clean and %-%-corrupted", err)
  end)

  it("--freeze passes the frozen modes on (the scores of ember.attribute with freeze)", function()
    local path = tiny("llama")
    local code, out, err = C.ember("attribute", "--model", path, "--clean", "the cat sat", "--corrupted",
      "the dog sat", "--metric", "logit:5", "--freeze", "attention,norm", "--top", "1")
    assert.are.equal(0, code, err)
    local m = ember.load { model = path }
    local r = ember.attribute { model = m, clean = "the cat sat", corrupted = "the dog sat", metric = "logit:5",
      freeze = { "attention", "norm" } }
    local plain = ember.attribute { model = m, clean = "the cat sat", corrupted = "the dog sat", metric = "logit:5" }
    assert.are_not.equal(plain.ranked[1].score, r.ranked[1].score)
    assert.matches(string.format("%.6g", r.ranked[1].score), out, 1, true)
    code, _, err = C.ember("attribute", "--model", path, "--clean", "a", "--corrupted", "b", "--freeze", "mlp")
    assert.are.equal(1, code)
    assert.matches("unknown frozen mode 'mlp'", err)
  end)

  it("refuses bad input: a missing prompt (usage, exit 2), unequal lengths (exit 1)", function()
    local path = tiny("llama")
    local code, _, err = C.ember("attribute", "--model", path, "--clean", "the cat sat")
    assert.are.equal(2, code)
    assert.matches("%-%-corrupted is required", err)
    code, _, err = C.ember("attribute", "--model", path, "--clean", "the cat sat", "--corrupted", "a")
    assert.are.equal(1, code)
    assert.matches("patching by position needs equal lengths", err)
    code, _, err = C.ember("attribute", "--model", path, "--clean", "a", "--corrupted", "b", "--out",
      "/proc/ember-attribute")
    assert.are.equal(2, code)
    assert.matches("%-%-out", err)
  end)
end)
