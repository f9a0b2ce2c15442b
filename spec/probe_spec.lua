-- Linear probes (`ember probe train|eval`, lib/ember/analysis/probe.lua, lib/ember/cli/probe.lua): the
-- numerics on hand-made data, the deterministic split, and on the tiny model a synthetic dataset
-- whose label is the prompt's first token: the probe must decode it from a later layer, and the
-- same training on shuffled labels must stay near chance. Both bounds are derived below.

local C = require("helpers.cli")
local ember_cli, need_model = C.ember, C.need_model
local fs = require("ember.store.fs")
local read_file = require("helpers.files").read
local json = require("ember.store.json")
local probe = require("ember.analysis.probe")

local write = require("helpers.artifacts").write

describe("ember.probe numerics", function()
  it("splits deterministically, stratified, with the held-out share per class", function()
    local y = {}
    for i = 1, 50 do y[i] = i <= 30 and 1 or 2 end
    local tr, held = probe.split(y, 2, 0.2, 7)
    local tr2, held2 = probe.split(y, 2, 0.2, 7)
    assert.same(tr, tr2)
    assert.same(held, held2)
    assert.equal(10, #held) -- round(30 * 0.2) + round(20 * 0.2)
    local c1 = 0
    for _, i in ipairs(held) do if y[i] == 1 then c1 = c1 + 1 end end
    assert.equal(6, c1)
    local _, held3 = probe.split(y, 2, 0.2, 8)
    assert.are_not.same(held, held3) -- another seed, another split
    -- every index exactly once
    local seen = {}
    for _, i in ipairs(tr) do seen[i] = (seen[i] or 0) + 1 end
    for _, i in ipairs(held) do seen[i] = (seen[i] or 0) + 1 end
    for i = 1, 50 do assert.equal(1, seen[i]) end
  end)

  it("fits a separable two-class problem and a three-class one (hand-made points)", function()
    -- class c sits around (c, -c) with a small fixed jitter: linearly separable by construction
    local X, y = {}, {}
    for i = 1, 60 do
      local c = (i % 3) + 1
      local j = ((i * 37) % 11) / 11 - 0.5
      X[i] = { 4 * c + 0.3 * j, -4 * c + 0.2 * j, j }
      y[i] = c
    end
    local p3 = probe.fit(X, y, 3, { iterations = 300 })
    assert.equal("softmax", p3.kind)
    local all = {}
    for i = 1, 60 do all[i] = i end
    assert.equal(1.0, (probe.accuracy(p3, X, y, all)))
    -- two classes: the logistic form
    local X2, y2 = {}, {}
    for i = 1, 40 do
      y2[i] = i % 2 + 1
      X2[i] = { (y2[i] == 2 and 1 or -1) + ((i * 7) % 5) / 20, (i % 3) / 3 }
    end
    local p2 = probe.fit(X2, y2, 2, { iterations = 300 })
    assert.equal("logistic", p2.kind)
    local all2 = {}
    for i = 1, 40 do all2[i] = i end
    assert.equal(1.0, (probe.accuracy(p2, X2, y2, all2)))
    -- the probabilities of a class sum to one
    local _, probs = probe.predict(p3, X[1])
    assert.is_true(math.abs(probs[1] + probs[2] + probs[3] - 1) < 1e-12)
  end)

  it("round-trips through the probe file and refuses damaged ones", function()
    local X, y = { { 0, 1 }, { 1, 0 }, { 0, 2 }, { 2, 0 } }, { 1, 2, 1, 2 }
    local p = probe.fit(X, y, 2, { iterations = 50 })
    local text = probe.encode(p, { model = { sha256 = "ab" }, layer = 1, pool = "last", labels = { "no", "yes" },
      training = { seed = 0 }, data = { source = "jsonl", path = "d.jsonl", sha256 = "cd", count = 4 } })
    local back = probe.decode(text, "p.json")
    for i = 1, 4 do
      local c1, p1 = probe.predict(p, X[i])
      local c2, q = probe.predict(back, X[i])
      assert.equal(c1, c2)
      assert.equal(p1[c1], q[c2]) -- the shortest round-tripping decimals: the same doubles
    end
    local doc = json.decode(text)
    doc.weights[1][2] = "x"
    local ok, err = pcall(probe.decode, json.encode(doc), "p.json")
    assert.is_false(ok)
    assert.matches("p.json: weights[1][2] is not a number", err, 1, true)
    -- standardize of another kind (found by fuzz_formats): a message naming the file, not a Lua error
    for _, v in ipairs({ 3, "s", true }) do
      doc = json.decode(text)
      doc.standardize = v
      ok, err = pcall(probe.decode, json.encode(doc), "p.json")
      assert.is_false(ok)
      assert.matches("p.json: standardize.mean must hold 2 numbers", err, 1, true)
    end
  end)
end)

-- The synthetic dataset: the label is the first word, "A" or "B" (one token each in the tiny
-- model's vocabulary); the four words after it are drawn from a fixed list by a fixed LCG, so
-- the two classes share their continuations' distribution and only the first token tells them apart.
local WORDS = { "cat", "dog", "sun", "tree", "red", "blue", "sky", "sea", "rock", "fish", "bird", "moon" }
local function dataset(path, n)
  local s, lines = 12345, {}
  local function r(k) s = (s * 1103515245 + 12345) % 2147483648; return s % k end
  for i = 1, n do
    local cls = i % 2 == 0 and "A" or "B"
    local t = { cls }
    for _ = 1, 4 do t[#t + 1] = WORDS[r(#WORDS) + 1] end
    lines[i] = string.format('{"prompt": "%s", "label": "%s"}', table.concat(t, " "), cls)
  end
  write(path, table.concat(lines, "\n") .. "\n")
end

describe("ember probe on the tiny model", function()
  local dir
  before_each(function() dir = fs.make_temp_dir("ember-probe-spec") end)
  after_each(function() fs.remove_tree(dir) end)

  -- 400 prompts, 20% held out per class: 80 held-out examples. Under the null hypothesis (labels
  -- independent of the features, the shuffled control) the held-out accuracy is Binomial(80, 1/2)/80:
  -- mean 0.5, standard deviation sqrt(0.25/80) = 0.056. Bounds:
  --   control: within 4 standard deviations of chance, |acc - 0.5| <= 0.224 (two-sided p < 1e-4);
  --   signal:  >= 0.9, more than 7 standard deviations above chance; the first token is in the
  --            residual stream of the last position only through attention, so perfection is not
  --            assumed, but a probe that cannot beat 0.9 on a two-token distinction has failed.
  local N, HELD = 400, 80
  local SD = math.sqrt(0.25 / HELD)

  it("decodes the first token from layer 3 and stays near chance on shuffled labels", function()
    local model_path = need_model()
    if not model_path then return end
    local data = fs.join(dir, "ab.jsonl")
    dataset(data, N)
    local out = fs.join(dir, "ab.probe.json")
    local code, stdout, err = ember_cli("probe", "train", "--model", model_path, "--data", data, "--layer", "3",
      "--out", out, "--control", "--seed", "1")
    assert.equal(0, code, err)
    assert.matches("held out   accuracy", stdout, 1, true)
    assert.matches("probe: extract: done, 400/400 prompts", err, 1, true) -- the summary (stderr is no terminal)
    local doc = json.decode(read_file(out))
    local t = doc.training
    assert.equal(HELD, t.n_heldout)
    assert.equal(N - HELD, t.n_train)
    assert.is_true(t.heldout_accuracy >= 0.9, "held-out accuracy " .. t.heldout_accuracy)
    assert.is_true(math.abs(t.control_heldout_accuracy - 0.5) <= 4 * SD,
      "control held-out accuracy " .. t.control_heldout_accuracy)
    assert.equal(0.5, t.heldout_majority) -- balanced classes: chance is one half
    -- provenance
    local ember = require("ember")
    assert.equal(ember.sha256(read_file(data)), doc.data.sha256)
    assert.equal(3, doc.layer)
    assert.equal(1, t.seed)
    assert.same({ "A", "B" }, doc.classes)
    local model = ember.load { model = model_path }
    assert.equal(require("ember.store.manifest").model_sha256(model), doc.model.sha256)
    model:close()

    -- eval applies the saved probe: on the same data it agrees with what training reported
    local code2, out2, err2 = ember_cli("probe", "eval", "--probe", out, "--data", data, "--model", model_path,
      "--json")
    assert.equal(0, code2, err2)
    local ev = json.decode(out2)
    assert.equal(N, ev.labelled)
    local expect = (t.train_accuracy * t.n_train + t.heldout_accuracy * t.n_heldout) / N
    assert.is_true(math.abs(ev.accuracy - expect) < 1e-9, ev.accuracy .. " vs " .. expect)

    -- training is deterministic: the same command gives the same weights
    local out_b = fs.join(dir, "b.probe.json")
    assert.equal(0, (ember_cli("probe", "train", "--model", model_path, "--data", data, "--layer", "3", "--out", out_b,
      "--control", "--seed", "1")))
    assert.same(doc.weights, json.decode(read_file(out_b)).weights)
  end)

  it("trains from an extraction file as from the prompts themselves", function()
    local model_path = need_model()
    if not model_path then return end
    local data = fs.join(dir, "ab.jsonl")
    dataset(data, 60)
    local ex = fs.join(dir, "ab.safetensors")
    assert.equal(0, (ember_cli("--model", model_path, "--prompts", data, "--extract-hidden", "2,3", "--extract-out",
      ex)))
    local code, out_a = ember_cli("probe", "train", "--data", ex, "--layer", "3", "--json")
    assert.equal(0, code, out_a)
    local code_b, out_b = ember_cli("probe", "train", "--model", model_path, "--data", data, "--layer", "3", "--json")
    assert.equal(0, code_b, out_b)
    assert.same(json.decode(out_b).training, json.decode(out_a).training)
    local code_c, _, err_c = ember_cli("probe", "train", "--data", ex, "--layer", "4")
    assert.equal(2, code_c)
    assert.matches("holds layers 2,3, not layer 4", err_c, 1, true)
  end)

  it("trains from Lua tensors exactly as the command does (ember.probe.train, probe:predict, probe:save)", function()
    local model_path = need_model()
    if not model_path then return end
    local ember = require("ember")
    local data = fs.join(dir, "ab.jsonl")
    dataset(data, 60)
    local prompts = {}
    for line in read_file(data):gmatch("[^\n]+") do prompts[#prompts + 1] = json.decode(line) end
    local model = ember.load { model = model_path }
    local runs = ember.extract_hidden { model = model, prompts = prompts, layers = { 3 } }
    local list, labels = {}, {}
    for i, r in ipairs(runs) do list[i], labels[i] = r.hidden[3], r.label end
    local pr = ember.probe.train { x = list, y = labels, seed = 1, control = true }
    -- the command on the same prompts: the same training section, value for value
    local out = fs.join(dir, "cli.probe.json")
    local code, stdout, err = ember_cli("probe", "train", "--model", model_path, "--data", data, "--layer", "3",
      "--seed", "1", "--control", "--json", "--out", out)
    assert.equal(0, code, err)
    local cli = json.decode(stdout).training
    for k, v in pairs(cli) do assert.equal(v, pr.training[k], k) end
    assert.same({ "A", "B" }, pr.classes)
    assert.equal("logistic", pr.kind)
    -- the same examples as one [n, d] tensor (each prompt's last row) train the same probe
    local hidden = model.info.hidden_size
    local rows = ember.tensor(#list, hidden)
    for i, t in ipairs(list) do
      local n = t:shape()[1]
      for c = 1, hidden do rows:set(i, c, t:get(n, c)) end
    end
    local pt = ember.probe.train { x = rows, y = labels, seed = 1, control = true }
    assert.same(pr.training, pt.training)
    -- saved, it is the command's file in every number
    local mine = fs.join(dir, "lua.probe.json")
    assert.is_true(pr:save(mine, { layer = 3, model = model }))
    local a, b = json.decode(read_file(mine)), json.decode(read_file(out))
    for _, k in ipairs({ "kind", "layer", "pool", "hidden_size", "classes", "standardize", "weights", "bias" }) do
      assert.same(b[k], a[k], k)
    end
    assert.equal(b.model.sha256, a.model.sha256)
    -- predictions: the sigmoid of the saved weights on the standardized features, computed here
    local got, probs = pr:predict(rows)
    assert.same({ #list, 2 }, probs:shape())
    local w, bias, mean, std = a.weights[1], a.bias[1], a.standardize.mean, a.standardize.std
    for i = 1, #list do
      local z = bias
      for c = 1, hidden do z = z + w[c] * ((rows:get(i, c) - mean[c]) / std[c]) end
      local p_b = 1 / (1 + math.exp(-z))
      assert.is_true(math.abs(probs:get(i, 2) - p_b) < 1e-6, i)
      assert.equal(p_b > 0.5 and "B" or "A", got[i])
    end
    -- ember.probe.load reads the command's file back into the same predictions
    local loaded_labels = ember.probe.load(out):predict(list)
    assert.same(got, loaded_labels)
    model:close()
  end)

  it("refuses what ember.probe.train cannot use, naming it", function()
    local ember = require("ember")
    local x = ember.tensor(4, 2, { 1, 0, 0, 1, 1, 1, 0, 0 })
    local cases = {
      { { x = x, y = { "a", "b" } }, "probe: y must hold one label per example (4), got 2" },
      { { x = x, y = { 1, 1, 1, 1 } }, "probe: every example has the label 1; a probe needs at least 2 classes" },
      { { x = { x, 3 }, y = { 1, 2 } }, "probe: x[2] is a number, not an ember.Tensor" },
      { { x = x, y = { 1, 2, 1, 2 }, pool = "max" }, "probe: pool must be last or mean, got max" },
      { { x = x, y = { 1, 2, 1, 2 }, seeds = 1 }, "probe: train: unknown option 'seeds'" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(ember.probe.train, c[1])
      assert.is_false(ok)
      assert.equal(c[2], err)
    end
    local pr = ember.probe.train { x = x, y = { 1, 2, 1, 2 }, holdout = 0 }
    local ok, err = pcall(pr.predict, pr, ember.tensor(1, 3))
    assert.is_false(ok)
    assert.equal("probe: predict: 3 features per example, the probe has 2", err)
    ok, err = pcall(pr.save, pr, fs.join(dir, "p.json"))
    assert.is_false(ok)
    assert.equal("probe: save: layer = L (0-based) is required", err)
  end)

  it("refuses bad input with the flag named, and a model the probe was not trained on", function()
    local model_path = need_model()
    if not model_path then return end
    local one = fs.join(dir, "one.jsonl")
    write(one, '{"prompt": "a", "label": 1}\n{"prompt": "b", "label": 1}\n')
    local nolabel = fs.join(dir, "nolabel.jsonl")
    write(nolabel, '{"prompt": "a"}\n')
    local cases = {
      { { "train", "--data", one }, "--layer L is required" },
      { { "train", "--layer", "1" }, "--data FILE is required" },
      { { "train", "--data", fs.join(dir, "none.jsonl"), "--layer", "1" }, "--data: cannot open" },
      { { "train", "--data", nolabel, "--layer", "1", "--model", model_path }, "line 1: field \"label\" is missing" },
      { { "train", "--data", one, "--layer", "1", "--model", model_path }, "a probe needs at least 2 classes" },
      { { "train", "--data", one, "--layer", "99", "--model", model_path }, "--layer: layer 99 is out of range" },
      { { "train", "--data", one, "--layer", "1" }, "--model FILE.gguf is required" },
      { { "train", "--data", one, "--layer", "1", "--holdout", "1" }, "--holdout: 1 is out of range" },
      { { "train", "--data", one, "--layer", "1", "--pool", "max" }, "--pool:" },
      { { "eval", "--data", one }, "--probe PROBE.json is required" },
      { { "eval", "--probe", fs.join(dir, "none.json"), "--data", one }, "--probe: cannot open" },
      { { "fit" }, "unknown subcommand 'fit'" },
    }
    for _, c in ipairs(cases) do
      local code, _, err = ember_cli("probe", table.unpack(c[1]))
      assert.equal(2, code, c[2] .. "\n" .. err)
      assert.matches(c[2], err, 1, true)
    end
    -- a probe records its model: another model is refused
    local data = fs.join(dir, "ab.jsonl")
    dataset(data, 20)
    local pf = fs.join(dir, "p.json")
    assert.equal(0, (ember_cli("probe", "train", "--model", model_path, "--data", data, "--layer", "1", "--out", pf)))
    local other = require("helpers.fixtures").tiny_model("--family llama --dtype f32 --layers 2 --seed 3")
    if other then
      local code, _, err = ember_cli("probe", "eval", "--probe", pf, "--data", data, "--model", other)
      assert.equal(2, code)
      assert.matches("the probe was trained on", err, 1, true)
    end
  end)
end)
