-- Sweeps over many prompt pairs (docs/sweeps.md, "Sweeps over a dataset"): each cell's per-pair
-- values are the single-pair sweeps' values of those pairs (each checked cell by cell against
-- hand-written patches in sweep_spec.lua), the mean and its standard error are recomputed here,
-- shards / --jobs / resume give the same bits, and bad input is named by its line.

local cjson = require("cjson")
local ember = require("ember")
local fs = require("ember.store.fs")
local store = require("ember.sweep.store")
local merge = require("ember.sweep.merge")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")
local read = require("helpers.files").read

local MODEL_ARGS = "--family llama --dtype f32 --layers 2 --seed 7"
-- the same length within each pair and across pairs (12 tokens), the first two tokens shared
local PAIRS = {
  { "The quick brown cat", "The slow brown fox" },
  { "The quick brown dog", "The quick green fox" },
  { "The quick black cat", "The slow black fox" },
}

describe("ember sweep --pairs", function()
  local path, model, work, answer, wrong
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    if not path then return end
    model = ember.load { model = path, threads = 1 }
    work = fs.make_temp_dir("ember-sweep-pairs")
    -- two token strings that are one token each (their own pieces read back)
    local found = {}
    for id = 300, model.info.n_vocab - 1 do
      local piece = model:detokenize({ id })
      local ok, back = pcall(model.to_single_token, model, piece)
      if ok and back == id and piece:match("^ %a+$") then found[#found + 1] = piece end
      if #found == 2 then break end
    end
    answer, wrong = found[1], found[2]
  end)
  teardown(function() if work then fs.remove_tree(work) end end)

  local function need()
    if not model then pending("tiny model unavailable") end
    if not answer then pending("no two one-token words in the tiny vocabulary") end
  end

  local function write_pairs(name, lines)
    local p = work .. "/" .. name
    local f = assert(io.open(p, "w"))
    f:write(table.concat(lines, "\n"), "\n")
    f:close()
    return p
  end

  local function dataset(name)
    local lines = {}
    for i, pr in ipairs(PAIRS) do
      -- text for two pairs, token ids for the third
      local clean = i == 3 and model:tokenize(pr[1]) or pr[1]
      lines[i] = cjson.encode({ clean = clean, corrupted = pr[2], answer = answer, wrong = wrong })
    end
    return write_pairs(name, lines)
  end

  it("stores each pair's value, their mean and standard error; each pair is its own single sweep", function()
    need()
    local file = dataset("pairs.jsonl")
    local res = ember.sweep { model = model, pairs = file, metric = "logit-diff",
      stages = { "after_layer", "after_mlp" }, out = work .. "/ds", checkpoint_seconds = 0 }
    assert.equal("complete", res.manifest.status)
    local m = cjson.decode(read(work .. "/ds/manifest.json"))
    assert.equal(3, m.pairs.count)
    assert.equal(ember.sha256(read(file)), m.pairs.file.sha256)
    assert.equal(file .. ":2", m.pairs.items[2].where)
    local a, w = model:to_single_token(answer), model:to_single_token(wrong)
    local singles = {}
    for i, pr in ipairs(PAIRS) do
      singles[i] = ember.sweep { model = model, clean = pr[1], corrupted = pr[2],
        metric = string.format("logit-diff:%d,%d", a, w), stages = { "after_layer", "after_mlp" } }
      assert.same({ a, w }, m.pairs.items[i].metric_tokens)
    end
    local clean_sum, corr_sum = 0.0, 0.0
    for i = 1, 3 do
      clean_sum = clean_sum + singles[i].manifest.clean.value
      corr_sum = corr_sum + singles[i].manifest.corrupted.value
    end
    assert.equal(clean_sum / 3, m.clean.value)
    assert.equal(corr_sum / 3, m.corrupted.value)
    assert.equal(2 * 2 * 12, #res.cells)
    for ci, c in ipairs(res.cells) do
      local vals, sum = {}, 0.0
      for i = 1, 3 do
        local s = singles[i].cells[ci]
        assert.equal(c.target, s.target)
        vals[i] = s.value
        sum = sum + s.value
      end
      assert.same(vals, c.values)
      local mean = sum / 3
      assert.equal(mean, c.value)
      local ss = 0.0
      for i = 1, 3 do ss = ss + (vals[i] - mean) ^ 2 end
      assert.is_true(math.abs(math.sqrt(ss / 2) / math.sqrt(3) - c.stderr) <= 1e-12 * (1 + math.abs(c.stderr)))
      local all = singles[1].cells[ci].certified and singles[2].cells[ci].certified and singles[3].cells[ci].certified
      assert.equal(all, c.certified)
      local denom = clean_sum / 3 - corr_sum / 3
      assert.equal((mean - corr_sum / 3) / denom, c.recovered)
    end
    -- the figures read the mean: the grid file holds the cells' means
    assert.matches("mean of 3 pairs", m.metric.label, 1, true)
  end)

  it("evaluates the pairs of a cell in one batch: every cell as with the pairs one after another", function()
    need()
    local file = dataset("pairs-batch.jsonl")
    local function sweep(batch)
      return ember.sweep { model = model, pairs = file, metric = "logit-diff",
        stages = { "after_layer", "after_attention" }, batch = batch }
    end
    local together, apart = sweep(nil), sweep(false)
    assert.equal(#apart.cells, #together.cells)
    local patched = 0
    for i, c in ipairs(together.cells) do
      assert.same(apart.cells[i], c) -- values, logits digests, certification, per-pair values
      if not c.certified then patched = patched + 1 end
    end
    assert.is_true(patched > 0, "no cell needed a pass")
    assert.equal(apart.stats.certified_without_pass, together.stats.certified_without_pass)
  end)

  it("gives the same bits in shards, with --jobs 2 and resumed; another dataset is refused", function()
    need()
    local file = dataset("pairs2.jsonl")
    local function cli(...)
      local code, _, err = C.ember("sweep", "--model", path, "--pairs", file, "--threads", "1", "--progress", "none",
        "--no-plot", ...)
      assert.equal(0, code, err)
    end
    cli("--out", work .. "/one")
    -- a partial run resumed
    cli("--out", work .. "/resumed", "--max-cells", "5")
    assert.equal("partial", cjson.decode(read(work .. "/resumed/manifest.json")).status)
    cli("--out", work .. "/resumed")
    for i = 0, 1 do cli("--shard", i .. "/2", "--out", work .. "/s" .. i) end
    merge.merge(work .. "/merged", { work .. "/s0", work .. "/s1" })
    for _, d in ipairs({ "resumed", "merged" }) do
      local res = merge.compare(store.read(work .. "/one"), store.read(work .. "/" .. d))
      assert.is_true(res.equal, merge.format(res, store.read(work .. "/one"), store.read(work .. "/" .. d)))
      assert.equal(read(work .. "/one/grid.safetensors"), read(work .. "/" .. d .. "/grid.safetensors"))
    end
    local launcher = fx.build .. "/ember"
    if fx.exists(launcher) then
      local cmd = string.format("%s sweep --model %s --pairs %s --out %s --jobs 2 --threads 1 --no-plot 2>%s",
        launcher, fs.shell_quote(path), fs.shell_quote(file), work .. "/jobs", work .. "/jobs.log")
      assert.is_true(os.execute(cmd) == true, read(work .. "/jobs.log"))
      local code, out = C.ember("sweep", "compare", work .. "/one", work .. "/jobs")
      assert.equal(0, code, out)
    end
    -- the same out with one pair fewer is another sweep
    local fewer = write_pairs("fewer.jsonl", { (read(file):match("^[^\n]*")) })
    local code, _, err = C.ember("sweep", "--model", path, "--pairs", fewer, "--out", work .. "/one", "--threads", "1",
      "--progress", "none", "--no-plot")
    assert.equal(1, code)
    assert.matches("holds another sweep (pairs.count", err, 1, true)
  end)

  it("names the line of every bad pair", function()
    need()
    local good = cjson.encode({ clean = PAIRS[1][1], corrupted = PAIRS[1][2], answer = answer, wrong = wrong })
    local cases = {
      { "not json", ":2: invalid JSON" },
      { cjson.encode({ clean = "The cat", corrupted = "The big brown dog" }), ":2: the clean prompt has" },
      { cjson.encode({ clean = "", corrupted = "x" }), ":2: clean is an empty prompt" },
      { cjson.encode({ clean = PAIRS[1][1], corrupted = PAIRS[1][2], answer = " quick brown" }),
        ":2: answer: \" quick brown\" is" },
      { cjson.encode({ clean = "The cat", corrupted = "The dog" }), ":1 has 12: every pair needs the same length" },
      { cjson.encode({ clean = PAIRS[1][1], corrupted = PAIRS[1][2], right = " a" }), ":2: unknown key 'right'" },
      { cjson.encode({ clean = { 1, 99999 }, corrupted = { 1, 2 } }), ":2: clean[1] is 99999, not a token id" },
      { cjson.encode({ clean = string.rep("a ", 300), corrupted = string.rep("b ", 300) }),
        "are over the model's context (256)" },
    }
    for i, case in ipairs(cases) do
      local file = write_pairs("bad" .. i .. ".jsonl", { good, case[1] })
      local ok, err = pcall(ember.sweep, { model = model, pairs = file, out = work .. "/bad" .. i })
      assert.is_false(ok, case[2])
      assert.matches(file .. ":2: ", tostring(err), 1, true)
      assert.matches(case[2], tostring(err), 1, true)
      assert.is_false(fs.exists(work .. "/bad" .. i)) -- nothing partial left behind
    end
    local empty = write_pairs("empty.jsonl", { "" })
    assert.has_error(function() ember.sweep { model = model, pairs = empty } end,
      "sweep: pairs '" .. empty .. "' holds no pairs")
    local code, _, err = C.ember("sweep", "--model", path, "--pairs", empty, "--clean", "a", "--out", work .. "/x")
    assert.equal(2, code)
    assert.matches("--pairs replaces --clean and --corrupted", err, 1, true)
  end)
end)
