-- Causal sweeps (docs/sweeps.md): position-aware patching, grids whose cells match single patches
-- run one by one, certified cells, bit-identity across threads / shards / resumes, merge refusals,
-- progress, heatmaps. Expectations are computed here independently: a hand-written hook copies
-- the clean row, and the metric is recomputed from the logits in this file.

local cjson = require("cjson")
local ember = require("ember")
local artifact = require("ember.store.artifact")
local fs = require("ember.store.fs")
local patch = require("ember.run.patch")
local sweep = require("ember.sweep")
local store = require("ember.sweep.store")
local merge = require("ember.sweep.merge")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")

local CLEAN, CORRUPTED = "The quick brown cat", "The slow brown fox" -- 12 tokens each, 2 shared
local MODEL_ARGS = "--family llama --dtype f32 --layers 2 --seed 7"

local function need_model(args)
  local path, why = fx.tiny_model(args or MODEL_ARGS)
  if not path then pending("tiny model unavailable: " .. tostring(why)) end
  return path
end

local function tmpdir()
  return fs.make_temp_dir("ember-sweep-spec")
end

local read = require("helpers.files").read

-- KL(clean || x) over two logits tensors, in double, computed without the library's helper.
local function kl(clean, x)
  local a, b = clean:values(), x:values()
  local function probs(v)
    local mx = -math.huge
    for _, y in ipairs(v) do mx = math.max(mx, y) end
    local out, s = {}, 0
    for i, y in ipairs(v) do out[i] = math.exp(y - mx); s = s + out[i] end
    for i = 1, #out do out[i] = out[i] / s end
    return out
  end
  local p, q = probs(a), probs(b)
  local d = 0
  for i = 1, #p do if p[i] > 0 then d = d + p[i] * (math.log(p[i]) - math.log(q[i])) end end
  return d
end

describe("position-aware activation patching", function()
  local model, dir, clean_ids, corr_ids
  setup(function()
    local path = fx.tiny_model(MODEL_ARGS)
    if not path then return end
    model = ember.load { model = path, threads = 1 }
    clean_ids, corr_ids = model:tokenize(CLEAN), model:tokenize(CORRUPTED)
    dir = tmpdir() .. "/clean"
    -- a real capture artifact of the clean prompt (prefill and 2 decodes)
    local code, _, err = C.ember("--model", path, "--prompt", CLEAN, "--max-tokens", "2", "--capture-activations", dir,
      "--capture-stages", "after_layer", "--run-manifest", fs.dirname(dir) .. "/run.json")
    assert(code == 0, err)
  end)
  teardown(function() if dir then fs.remove_tree(fs.dirname(dir)) end end)

  it("patches only the targeted prefill rows, from another prompt of the same length", function()
    need_model()
    local src = artifact.read(dir)
    local s = model:session {}
    -- the reference: a hook written here copies row p of the clean record into the corrupted run
    local rec
    for _, r in ipairs(src.records) do if r.layer == 1 and r.phase == "prefill" then rec = r end end
    local cols = rec.shape[2]
    for _, p in ipairs({ 0, 4, 11 }) do
      local bytes = rec.tensor:bytes()
      local row = ember.tensor_from_bytes(bytes:sub(p * cols * 4 + 1, (p + 1) * cols * 4), 1, cols)
      local by_hand = { name = "by-hand", after_layer = function(_, ctx, v)
        if ctx.layer_index == 1 then v:row(p + 1):copy_from(row) end
      end }
      s:reset()
      local want = s:prefill(corr_ids, { experiment = by_hand })
      local exp = patch.experiment { source = src, target = { layer = 1, stage = "after_layer" }, model = model,
        positions = { p }, certify = true }
      s:reset()
      local got = s:prefill(corr_ids, { experiment = exp })
      exp:on_generation_complete()
      assert.equal(want:sha256(), got:sha256())
      assert.equal(1, exp.stats.rows_patched)
      -- causal attention: row 0 (BOS in both prompts) saw only token 0, so it already held the clean bytes
      assert.equal(p == 0, exp.identical())
    end
  end)

  it("certifies a row that already held the source's bytes (shared prefix of a causal model)", function()
    need_model()
    local src = artifact.read(dir)
    local s = model:session {}
    local base = s:prefill(corr_ids)
    for _, p in ipairs({ 0, 1 }) do
      local exp = patch.experiment { source = src, target = { layer = 0, stage = "after_layer" }, model = model,
        positions = { p }, certify = true }
      s:reset()
      local got = s:prefill(corr_ids, { experiment = exp })
      assert.is_true(exp.identical())
      assert.equal(base:sha256(), got:sha256())
    end
  end)

  it("patches decode positions and refuses what it cannot apply", function()
    need_model()
    local src = artifact.read(dir)
    -- decode position 12 exists in the source (the first decode); patch only it
    local exp = patch.experiment { source = src, target = { layer = 1, stage = "after_layer" }, model = model,
      positions = { 12 } }
    local out = model:generate { ids = clean_ids, max_tokens = 2, experiment = exp }
    assert.equal(1, exp.stats.decode)
    assert.equal(0, exp.stats.prefill)
    assert.is_true(out.modified)
    -- a position no record holds: refused at setup, naming it
    assert.has_error(function()
      patch.experiment { source = src, target = { layer = 1, stage = "after_layer" }, model = model,
        positions = { 40 } }
    end, "activation-patch: no source record for after_layer layer 1 at position 40 in '" .. dir
      .. "': every targeted position needs one")
    -- the decode record at 13 is never evaluated by a 1-token generation: the run fails at the end
    local unapplied = patch.experiment { source = src, target = { layer = 1, stage = "after_layer" }, model = model,
      positions = { 13 } }
    local ok, err = pcall(model.generate, model, { ids = clean_ids, max_tokens = 1, experiment = unapplied })
    assert.is_false(ok)
    assert.matches("was never applied", err)
    -- a prompt of another length: the prefill record's rows do not match
    local other = patch.experiment { source = src, target = { layer = 1, stage = "after_layer" }, model = model,
      positions = { 3 } }
    ok, err = pcall(model.generate, model, { ids = { clean_ids[1], clean_ids[2], clean_ids[3] }, max_tokens = 0,
      experiment = other })
    assert.is_false(ok)
    assert.matches("shape mismatch", err)
  end)
end)

describe("ember.sweep", function()
  local path, model, work
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    if not path then return end
    model = ember.load { model = path, threads = 1 }
    work = tmpdir()
  end)
  teardown(function() if work then fs.remove_tree(work) end end)

  local function run(name, extra)
    local o = { model = model, clean = CLEAN, corrupted = CORRUPTED, metric = "kl", out = work .. "/" .. name,
      checkpoint_seconds = 0 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return ember.sweep(o), o.out
  end

  it("gives a grid (all layers x all positions x after_layer) whose cells match single patches", function()
    need_model()
    local res, dir = run("full")
    assert.equal("complete", res.manifest.status)
    assert.equal(2 * 12, #res.cells)
    local s = model:session {}
    local clean = s:prefill(model:tokenize(CLEAN))
    s:reset()
    local corrupted = s:prefill(model:tokenize(CORRUPTED))
    -- clean rows captured by a hook written here, then each cell redone by hand
    local rows = {}
    s:reset()
    s:prefill(model:tokenize(CLEAN), { experiment = { name = "grab", after_layer = function(_, ctx, v)
      rows[ctx.layer_index] = v:clone()
    end } })
    local certified = 0
    for _, c in ipairs(res.cells) do
      local row = rows[c.layer]:row(c.position + 1)
      s:reset()
      local got = s:prefill(model:tokenize(CORRUPTED), { experiment = { name = "one", after_layer = function(_, ctx, v)
        if ctx.layer_index == c.layer then v:row(c.position + 1):copy_from(row) end
      end } })
      assert.equal(got:sha256(), c.logits_sha256)
      assert.equal(kl(clean, got), c.value)
      assert.equal(got:argmax() - 1, c.top1)
      if c.certified then
        certified = certified + 1
        assert.equal(corrupted:sha256(), c.logits_sha256)
        assert.is_true(c.equals_corrupted)
        assert.is_true(c.position <= 1) -- only the shared prefix (BOS, "The") can be certified
      end
    end
    assert.equal(4, certified) -- positions 0 and 1 of both layers
    -- the last layer at the last position carries everything: KL 0, fully recovered
    local last = res.cells[#res.cells]
    assert.equal(0.0, last.value)
    assert.equal(1.0, last.recovered)
    -- the manifest on disk says the same, cell by cell, with provenance
    local m = cjson.decode(read(dir .. "/manifest.json"))
    assert.equal("ember.sweep", m.schema)
    assert.equal(24, #m.cells)
    assert.equal(m.settings_sha256, m.cells[1].settings_sha256)
    assert.equal(64, #m.cells[1].source.record_sha256)
    assert.equal("1:after_layer@11", m.cells[24].target)
    assert.same({ "after_layer" }, m.grid.stages)
    assert.equal(1, m.execution.threads)
    assert.equal(kl(clean, corrupted), m.corrupted.value)
  end)

  it("is bit-identical across thread counts and repeated runs", function()
    need_model()
    local a, da = run("t1a")
    local _, db = run("t1b")
    local m2 = ember.load { model = path, threads = 2 }
    local c = ember.sweep { model = m2, clean = CLEAN, corrupted = CORRUPTED, metric = "kl", out = work .. "/t2" }
    assert.equal(2, c.manifest.execution.threads)
    for _, d in ipairs({ db, work .. "/t2" }) do
      local res = merge.compare(store.read(da), store.read(d))
      assert.is_true(res.equal, merge.format(res, store.read(da), store.read(d)))
      assert.equal(#a.cells, res.compared)
      assert.equal(read(da .. "/grid.safetensors"), read(d .. "/grid.safetensors"))
    end
    -- and compare notices a difference
    local other = ember.sweep { model = model, clean = CLEAN, corrupted = CORRUPTED, metric = "prob",
      out = work .. "/prob" }
    local res = merge.compare(store.read(da), store.read(other.dir))
    assert.is_false(res.equal)
    assert.equal("metric.kind", res.provenance[1].path)
  end)

  it("merges 4 shards bit-identical to the single-process grid, and refuses foreign shards by name", function()
    need_model()
    local _, single = run("single")
    local dirs = {}
    for i = 0, 3 do
      local r, d = run("shard" .. i, { shard = i .. "/4" })
      dirs[#dirs + 1] = d
      for _, c in ipairs(r.cells) do assert.equal(i, c.index % 4) end
    end
    local merged = merge.merge(work .. "/merged", dirs)
    assert.equal("complete", merged.manifest.status)
    local res = merge.compare(store.read(single), store.read(work .. "/merged"))
    assert.is_true(res.equal, merge.format(res, store.read(single), store.read(work .. "/merged")))
    assert.equal(read(single .. "/grid.safetensors"), read(work .. "/merged/grid.safetensors"))
    -- a shard of another corrupted prompt (same length)
    local _, foreign = run("foreign", { shard = "1/4", corrupted = "The quick brown dog" })
    local ok, err = pcall(merge.merge, work .. "/m3", { dirs[1], foreign, dirs[3], dirs[4] })
    assert.is_false(ok)
    assert.matches(string.format("sweep merge: shard '%s' does not belong with '%s': corrupted.prompt.sha256 differs",
      foreign, dirs[1]), err, 1, true)
    -- a shard of another model (another seed)
    local other_path = need_model("--family llama --dtype f32 --layers 2 --seed 8")
    local om = ember.load { model = other_path, threads = 1 }
    local o = ember.sweep { model = om, clean = CLEAN, corrupted = CORRUPTED, metric = "kl", shard = "2/4",
      out = work .. "/othermodel" }
    ok, err = pcall(merge.merge, work .. "/m4", { dirs[1], dirs[2], o.dir, dirs[4] })
    assert.is_false(ok)
    assert.matches("model.sha256 differs", err, 1, true)
    -- a missing shard and a duplicated one
    ok, err = pcall(merge.merge, work .. "/m5", { dirs[1], dirs[2], dirs[3] })
    assert.is_false(ok)
    assert.matches("shard 3/4: missing (no directory given holds it)", err, 1, true)
    ok, err = pcall(merge.merge, work .. "/m6", { dirs[1], dirs[1], dirs[3], dirs[4] })
    assert.is_false(ok)
    assert.matches("are both shard 0/4", err, 1, true)
    assert.is_false(fs.exists(work .. "/m4"))
  end)

  it("resumes an interrupted sweep: the same grid, only the missing cells computed", function()
    need_model()
    local _, full = run("whole")
    -- interrupted by a failure after 7 cells: what was computed is kept
    local n = 0
    local ok, err = pcall(run, "resumed", { on_cell = function()
      n = n + 1
      if n == 7 then error("simulated interruption", 0) end
    end })
    assert.is_false(ok)
    assert.equal("simulated interruption", err)
    local partial = store.read(work .. "/resumed", { partial_ok = true })
    assert.equal("partial", partial.manifest.status)
    assert.equal(7, #partial.cells)
    assert.has_error(function() store.read(work .. "/resumed") end)
    -- a budget stops it again after 5 more
    local r2 = run("resumed", { max_cells = 5 })
    assert.equal(5, r2.stats.computed)
    assert.equal(7, r2.stats.resumed)
    -- the rerun computes only the 12 still missing
    local computed = {}
    local r3 = run("resumed", { on_cell = function(c) computed[#computed + 1] = c.index end })
    assert.equal(12, r3.stats.computed)
    assert.equal(12, #computed)
    assert.equal(12, r3.stats.resumed)
    assert.equal("complete", r3.manifest.status)
    local res = merge.compare(store.read(full), store.read(work .. "/resumed"))
    assert.is_true(res.equal)
    assert.equal(read(full .. "/grid.safetensors"), read(work .. "/resumed/grid.safetensors"))
    -- resuming into another sweep's directory is refused, naming the field
    ok, err = pcall(run, "resumed", { metric = "prob" })
    assert.is_false(ok)
    assert.matches("holds another sweep (metric.kind", err, 1, true)
  end)

  it("reports progress: a final summary off a terminal, one rewritten line on one", function()
    need_model()
    local progress = require("ember.sweep.progress")
    local sink = C.sink()
    run("prog", { progress = progress.new { stream = sink, mode = "summary" } })
    local text = sink:text()
    assert.matches("^sweep: done, 24/24 cells %(24 computed, 0 resumed%) in [%d.]+s", text)
    assert.equal(1, select(2, text:gsub("\n", "")))
    local tty = C.sink()
    run("prog2", { progress = progress.new { stream = tty, mode = "tty" } })
    assert.matches("\r\27%[K", tty:text())
    assert.matches("cells/s, ETA", tty:text(), 1, true)
    local quiet = C.sink()
    run("prog3", { progress = progress.new { stream = quiet, mode = "none" } })
    assert.equal("", quiet:text())
  end)

  it("sweeps decode positions: N greedy tokens per run, cells match runs patched by hand", function()
    need_model()
    local N = 3
    local res = run("decode", { decode_steps = N, positions = { 10, 11, 12, 13, 14 },
      stages = { "after_layer", "after_mlp" } })
    assert.equal("complete", res.manifest.status)
    assert.equal(2 * 2 * 5, #res.cells)
    assert.equal(N, res.manifest.grid.decode_steps)
    assert.equal("prefill+decode", res.manifest.grid.phase)
    local s = model:session {}
    -- a greedy run written here: prefill, then N decodes feeding back the top-1, with one hook
    local function greedy(ids, exp)
      s:reset()
      local opts = exp and { experiment = exp } or nil
      local logits, gen = s:prefill(ids, opts), {}
      for _ = 1, N do
        gen[#gen + 1] = logits:argmax() - 1
        logits = s:decode(gen[#gen], opts)
      end
      return logits, gen
    end
    -- the clean rows of every evaluation, by stage, layer and absolute position
    local rows = {}
    local function grab(stage)
      return function(_, ctx, v)
        for i = 1, ctx.input_token_count do
          rows[stage .. ctx.layer_index .. "@" .. (ctx.start_position + i - 1)] = v:row(i):clone()
        end
      end
    end
    local clean, clean_gen = greedy(model:tokenize(CLEAN), { name = "grab", after_layer = grab("after_layer"),
      after_mlp = grab("after_mlp") })
    local corrupted, corr_gen = greedy(model:tokenize(CORRUPTED))
    assert.same(clean_gen, res.manifest.clean.generated_ids)
    assert.same(corr_gen, res.manifest.corrupted.generated_ids)
    assert.equal(corrupted:sha256(), res.manifest.corrupted.logits_sha256)
    local decode_cells, moved = 0, 0
    for _, c in ipairs(res.cells) do
      local row = rows[c.stage .. c.layer .. "@" .. c.position]
      local got, gen = greedy(model:tokenize(CORRUPTED), { name = "one", [c.stage] = function(_, ctx, v)
        local i = c.position - ctx.start_position + 1
        if ctx.layer_index == c.layer and i >= 1 and i <= ctx.input_token_count then v:row(i):copy_from(row) end
      end })
      assert.equal(got:sha256(), c.logits_sha256, c.target)
      assert.equal(kl(clean, got), c.value, c.target)
      assert.same(gen, c.generated_ids)
      if c.certified then assert.equal(corrupted:sha256(), c.logits_sha256) end
      if c.position >= 12 then
        decode_cells = decode_cells + 1
        if got:sha256() ~= corrupted:sha256() then moved = moved + 1 end
      end
    end
    assert.equal(2 * 2 * 3, decode_cells)
    assert.is_true(moved > 0, "no decode-position patch changed the final logits")
    -- the last layer's finished state at the last decode position carries the clean run: KL 0
    local last = res.cells[10] -- after_layer, layer 1, position 14
    assert.equal("1:after_layer@14", last.target)
    assert.equal(0.0, last.value)
    -- beyond the last decode step there is nothing to patch
    assert.has_error(function() run("decode-bad", { decode_steps = N, positions = { 15 } }) end,
      "sweep: position 15 is out of range (12 prompt tokens + 3 decode steps: 0-14)")
  end)

  it("evaluates a cell from its position on (reuse): every cell bit-identical to a run from position 0", function()
    need_model()
    -- the clean and corrupted prompts share their first 2 tokens: those cells need no pass
    local grids = {
      { stages = "all", metric = "kl" },
      -- decode positions, out of order (each cell rewinds below or beyond the one before)
      { decode_steps = 3, positions = { 13, 2, 11, 0, 14, 12, 5, 1 }, stages = { "after_layer", "before_layer" },
        metric = "logit-diff" },
    }
    for g, grid in ipairs(grids) do
      local on = run("reuse-on" .. g, grid)
      local off_opts = { reuse = false }
      for k, v in pairs(grid) do off_opts[k] = v end
      local off = run("reuse-off" .. g, off_opts)
      assert.equal(#off.cells, #on.cells)
      local shared = 0
      for i, a in ipairs(off.cells) do
        local b = on.cells[i]
        for _, k in ipairs({ "index", "target", "value", "recovered", "certified", "equals_corrupted", "top1",
          "logits_sha256" }) do
          assert.equal(a[k], b[k], string.format("grid %d cell %s: %s", g, a.target, k))
        end
        assert.same(a.generated_ids, b.generated_ids)
        assert.same(a.source, b.source)
        if a.position <= 1 then
          shared = shared + 1
          -- computed with a pass, the shared prefix is certified: what reuse assumed without one
          assert.is_true(a.certified and a.equals_corrupted, a.target)
        end
      end
      assert.is_true(shared > 0)
      assert.equal(shared, on.stats.certified_without_pass)
      assert.equal(0, off.stats.certified_without_pass)
      local res = merge.compare(store.read(on.dir), store.read(off.dir))
      assert.is_true(res.equal, merge.format(res, store.read(on.dir), store.read(off.dir)))
      assert.equal(read(on.dir .. "/grid.safetensors"), read(off.dir .. "/grid.safetensors"))
    end
  end)

  it("refuses prompts of different lengths and stages it cannot patch", function()
    need_model()
    -- the message lists both prompts' tokens (position, piece with spaces as U+2423, <id> for none)
    local function pieces(text)
      local out = {}
      for i, id in ipairs(model:tokenize(text)) do
        local p = model:detokenize({ id }):gsub(" ", "\u{2423}")
        out[i] = string.format("%d %s", i - 1, p == "" and ("<" .. id .. ">") or p)
      end
      return table.concat(out, " | ")
    end
    assert.has_error(function() ember.sweep { model = model, clean = CLEAN, corrupted = "The fox" } end,
      "sweep: the clean prompt has 12 tokens and the corrupted prompt " .. #model:tokenize("The fox")
      .. ": patching by position needs equal lengths\n  clean:     " .. pieces(CLEAN) .. "\n  corrupted: "
      .. pieces("The fox"))
    assert.has_error(function()
      ember.sweep { model = model, clean = CLEAN, corrupted = CORRUPTED, stages = { "after_logits" } }
    end,
      "sweep: stage 'after_logits' is not a per-layer stage (before_layer|after_attention|after_mlp|after_layer)")
    assert.has_error(function() ember.sweep { model = model, clean = CLEAN, corrupted = CORRUPTED, layers = { 5 } } end,
      "sweep: layer 5 is out of range (the model has 2 layers: 0-1)")
  end)
end)

describe("ember sweep (command)", function()
  local path, work
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    work = tmpdir()
  end)
  teardown(function() if work then fs.remove_tree(work) end end)

  it("draws the heatmap as SVG and PNG with the labels the manifest names", function()
    need_model()
    if not require("ember.analysis.plot").gnuplot() then pending("gnuplot is not installed") end
    local dir = work .. "/cmd"
    local code, _, err = C.ember("sweep", "--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out", dir,
      "--metric", "logit-diff", "--stages", "after_attention,after_layer", "--threads", "1", "--progress", "none")
    assert.equal(0, code, err)
    local m = cjson.decode(read(dir .. "/manifest.json"))
    assert.equal("logit-diff", m.metric.kind)
    assert.same({ m.clean.top1, m.corrupted.top1 }, m.metric.tokens)
    -- per stage: the metric and the recovered share, each with both baselines on its colour bar
    assert.equal(4, #m.plot.files)
    local function g4(v) return (string.format("%.4g", v)) end
    local want = {
      metric = { palette = "diverging", title = m.plot.title, marks = { "clean " .. g4(m.clean.value),
        "corrupted " .. g4(m.corrupted.value) } },
      recovered = { palette = "diverging", title = "recovered share, " .. m.plot.title,
        marks = { "clean 1", "corrupted 0" } },
    }
    for i, f in ipairs(m.plot.files) do
      local w = want[f.value]
      assert.equal(i <= 2 and "after_attention" or "after_layer", f.stage)
      assert.equal(w.palette, f.palette)
      assert.equal(w.title .. " at " .. f.stage, f.title)
      local svg = read(dir .. "/" .. f.svg)
      local png = read(dir .. "/" .. f.png)
      assert.equal("\137PNG\r\n\26\n", png:sub(1, 8))
      -- gnuplot's SVG escapes '&' and '<' in text (an XML reader needs nothing else escaped there)
      local function xml(s) return (s:gsub("&", "&amp;"):gsub("<", "&lt;")) end
      for _, mark in ipairs(w.marks) do assert.truthy(svg:find(mark, 1, true), "baseline missing: " .. mark) end
      for _, label in ipairs({ m.plot.xlabel, m.plot.ylabel, f.title, f.cblabel }) do
        assert.truthy(svg:find(">" .. xml(label) .. "<", 1, true), "label missing from " .. f.svg .. ": " .. label)
      end
      for _, tic in ipairs(m.plot.xtics) do
        assert.truthy(svg:find(">" .. xml(tic) .. "<", 1, true), "tic missing from " .. f.svg .. ": " .. tic)
      end
      assert.equal(12, #m.plot.xtics)
      -- position 2: " qu" in the clean prompt, " s" in the corrupted, their spaces shown as U+2423
      assert.equal("2 \u{2423}qu/\u{2423}s", m.plot.xtics[3])
      -- the SVG opens in an independent renderer
      local rsvg = os.execute("command -v rsvg-convert >/dev/null 2>&1")
      if rsvg then
        local out = work .. "/check.png"
        assert.is_true(os.execute("rsvg-convert -o " .. out .. " " .. dir .. "/" .. f.svg) == true)
        assert.equal("\137PNG\r\n\26\n", read(out):sub(1, 8))
      end
    end
  end)

  it("runs --jobs 2 as local processes, bit-identical to one process; compare says so", function()
    need_model()
    local launcher = fx.build .. "/ember"
    if not fx.exists(launcher) then pending("missing " .. launcher) end
    local one, two = work .. "/one", work .. "/two"
    local code, _, err = C.ember("sweep", "--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out", one,
      "--threads", "1", "--progress", "none", "--no-plot")
    assert.equal(0, code, err)
    local cmd = string.format(
      "%s sweep --model %s --clean %s --corrupted %s --out %s --jobs 2 --threads 1 --no-plot 2>%s",
      launcher, fs.shell_quote(path), fs.shell_quote(CLEAN), fs.shell_quote(CORRUPTED), two, work .. "/jobs.log")
    assert.is_true(os.execute(cmd) == true, read(work .. "/jobs.log"))
    assert.matches("sweep: done, 24/24 cells", read(work .. "/jobs.log"), 1, true)
    local out
    code, out = C.ember("sweep", "compare", one, two)
    assert.equal(0, code, out)
    assert.matches("24 compared, 0 differing", out, 1, true)
    local m = cjson.decode(read(two .. "/manifest.json"))
    assert.equal(2, #m.merged_from)
  end)

  it("takes the metric's tokens as strings, each one token, the same sweep as with their ids", function()
    need_model()
    local m = ember.load { model = path, threads = 1 }
    -- the ids, found here: each string is one token of the tiny model's vocabulary
    local function one(text)
      local ids = m:tokenize(text, { bos = false })
      assert.equal(1, #ids, text)
      return ids[1]
    end
    local a, b = one(" qu"), one(" s")
    local many = m:tokenize(" quick", { bos = false })
    m:close()
    local function sweep(name, metric)
      local dir = work .. "/" .. name
      local code, _, err = C.ember("sweep", "--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out", dir,
        "--metric", metric, "--layers", "1", "--threads", "1", "--progress", "none", "--no-plot")
      return code, err, dir
    end
    local code, err, by_ids = sweep("m-ids", string.format("logit-diff:%d,%d", a, b))
    assert.equal(0, code, err)
    -- the quoted form (what --metric 'logit-diff:" qu"," s"' passes) and what a shell leaves of
    -- --metric logit-diff:" qu"," s" unquoted
    for i, metric in ipairs({ 'logit-diff:" qu"," s"', "logit-diff: qu, s" }) do
      local c, e, dir = sweep("m-str" .. i, metric)
      assert.equal(0, c, e)
      local res = merge.compare(store.read(by_ids), store.read(dir))
      assert.is_true(res.equal, merge.format(res, store.read(by_ids), store.read(dir)))
      assert.same({ a, b }, cjson.decode(read(dir .. "/manifest.json")).metric.tokens)
    end
    -- a string of several tokens is refused, naming how many
    code, err = sweep("m-many", 'logit-diff:" quick"," s"')
    assert.equal(1, code)
    assert.matches(string.format("metric: \" quick\" is %d tokens, not one", #many), err, 1, true)
    -- from Lua, a metric table may hold the strings themselves
    local lm = ember.load { model = path, threads = 1 }
    local res = ember.sweep { model = lm, clean = CLEAN, corrupted = CORRUPTED, layers = "1", positions = "2",
      metric = { kind = "logit-diff", tokens = { " qu", b } } }
    lm:close()
    assert.same({ a, b }, res.manifest.metric.tokens)
  end)

  it("refuses a logit difference of a token with itself (0 whatever the patch)", function()
    need_model()
    local code, _, err = C.ember("sweep", "--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out",
      work .. "/m-same", "--metric", "logit-diff:7,7", "--layers", "1", "--threads", "1", "--progress", "none",
      "--no-plot")
    assert.equal(1, code)
    assert.matches("metric: logit-diff of token 7 with itself is always 0", err, 1, true)
    assert.is_false(require("ember.store.fs").exists(work .. "/m-same"))
  end)

  it("gives usage errors for missing or malformed flags", function()
    local code, _, err = C.ember("sweep", "--model", "x.gguf", "--clean", "a")
    assert.equal(2, code)
    assert.matches("sweep: --corrupted is required", err, 1, true)
    code, _, err = C.ember("sweep", "--shard", "4/4")
    assert.equal(2, code)
    assert.matches("--shard: expected I/N with 0 <= I < N", err, 1, true)
    code, _, err = C.ember("sweep", "--metric", "logit-diff:1")
    assert.equal(2, code)
    assert.matches("logit-diff needs 2 tokens after ':' (ids, or strings as \" Paris\")", err, 1, true)
    code, _, err = C.ember("sweep", "merge", work .. "/none")
    assert.equal(2, code)
    -- the same through the launcher, where cli.lua runs as a script
    local launcher = fx.build .. "/ember"
    if fx.exists(launcher) then
      local ok, how, status = os.execute(launcher .. " sweep --clean a 2>/dev/null")
      assert.same({ nil, "exit", 2 }, { ok, how, status })
      ok, how, status = os.execute(launcher .. " compare-models a.gguf 2>/dev/null")
      assert.same({ nil, "exit", 2 }, { ok, how, status })
    end
  end)
end)

describe("ember --activation-patch --patch-positions", function()
  it("patches only the listed positions and records them", function()
    local path = need_model()
    local work = tmpdir()
    local src = work .. "/clean"
    local code, _, err = C.ember("--model", path, "--prompt", CLEAN, "--max-tokens", "1", "--capture-activations", src,
      "--capture-stages", "after_layer", "--run-manifest", work .. "/a.json")
    assert.equal(0, code, err)
    code, _, err = C.ember("--model", path, "--prompt", CORRUPTED, "--max-tokens", "1", "--activation-patch", src,
      "--patch-target", "1:after_layer", "--patch-positions", "11", "--run-manifest", work .. "/b.json")
    assert.equal(0, code, err)
    local m = cjson.decode(read(work .. "/b.json"))
    assert.equal(work .. "/clean 1:after_layer positions=11", m.experiment.args)
    local stats = m.experiment.members[1].stats
    assert.equal(1, stats.prefill) -- the decode at position 12 holds no targeted position
    assert.equal(0, stats.decode)
    assert.equal(1, stats.rows_patched)
    -- patching the last layer at the last prompt position gives the clean run's next token
    local a = cjson.decode(read(work .. "/a.json"))
    assert.equal(a.generated_ids[1], m.generated_ids[1])
    code, _, err = C.ember("--model", path, "--prompt", CORRUPTED, "--patch-positions", "3")
    assert.equal(2, code)
    assert.matches("--patch-positions needs --activation-patch DIR", err, 1, true)
    fs.remove_tree(work)
  end)
end)

describe("ember sweep killed midway", function()
  it("resumes after SIGKILL with the same grid, computing only the missing cells", function()
    local model = fx.root .. "/parity/llama-tiny-f32/model.gguf"
    if not fx.exists(model) then pending("missing " .. model) end
    local launcher = fx.build .. "/ember"
    if not fx.exists(launcher) then pending("missing " .. launcher) end
    local work = tmpdir()
    local q = fs.shell_quote
    local clean = "The quick brown fox jumps over the lazy dog."
    local corrupted = "The quick brown cat jumps over the lazy dog."
    local flags = string.format("sweep --model %s --clean %s --corrupted %s --stages all --threads 1 --no-plot "
      .. "--progress none", q(model), q(clean), q(corrupted))
    -- the reference: one uninterrupted run
    assert.is_true(os.execute(string.format("%s %s --out %s 2>/dev/null", launcher, flags, q(work .. "/ref"))) == true)
    local total = #store.read(work .. "/ref").cells
    -- the same sweep, killed (SIGKILL: no chance to save anything) once it has written some cells
    local dir = work .. "/killed"
    os.execute("sh -c " .. q(string.format("%s %s --out %s --checkpoint 0.05 2>/dev/null & echo $! >%s", launcher,
      flags, q(dir), q(work .. "/pid"))))
    local pid = read(work .. "/pid"):match("%d+")
    local kept
    for _ = 1, 400 do
      local ok, sw = pcall(store.read, dir, { partial_ok = true })
      if ok and #sw.cells >= 20 then kept = sw; break end
      os.execute("sleep 0.02")
    end
    os.execute("kill -9 " .. pid .. " 2>/dev/null")
    os.execute("sleep 0.1")
    assert.truthy(kept, "the sweep never wrote 20 cells")
    local at_kill = store.read(dir, { partial_ok = true })
    assert.equal("partial", at_kill.manifest.status, "the sweep finished before it could be killed")
    local k = #at_kill.cells
    assert.is_true(k >= 20 and k < total)
    -- rerun: only the missing cells are computed, and the grid is the reference's
    local code, _, err = C.ember(table.unpack({ "sweep", "--model", model, "--clean", clean, "--corrupted", corrupted,
      "--stages", "all", "--threads", "1", "--no-plot", "--progress", "none", "--out", dir }))
    assert.equal(0, code, err)
    assert.matches(string.format("(%d computed now, %d resumed)", total - k, k), err, 1, true)
    local res = merge.compare(store.read(work .. "/ref"), store.read(dir))
    assert.is_true(res.equal, merge.format(res, store.read(work .. "/ref"), store.read(dir)))
    assert.equal(read(work .. "/ref/grid.safetensors"), read(dir .. "/grid.safetensors"))
    fs.remove_tree(work)
  end)
end)

describe("ember sweep stopped before the end", function()
  local launcher = fx.build .. "/ember"
  local q = fs.shell_quote
  local clean = "The quick brown fox jumps over the lazy dog."
  local corrupted = "The quick brown cat jumps over the lazy dog."

  it("says on Ctrl-C how many cells it saved and how to go on, and the rerun resumes", function()
    local model = fx.root .. "/parity/llama-tiny-f32/model.gguf"
    if not fx.exists(model) then pending("missing " .. model) end
    if not fx.exists(launcher) then pending("missing " .. launcher) end
    local work = tmpdir()
    local dir = work .. "/int"
    local args = { "sweep", "--model", model, "--clean", clean, "--corrupted", corrupted, "--stages", "all",
      "--threads", "1", "--no-plot", "--progress", "none", "--out", dir }
    local line = { launcher }
    for _, a in ipairs(args) do line[#line + 1] = q(a) end
    os.execute("sh -c " .. q(table.concat(line, " ") .. " --checkpoint 0.05 2>" .. q(work .. "/err") .. " & echo $! >"
      .. q(work .. "/pid")))
    local pid = read(work .. "/pid"):match("%d+")
    for _ = 1, 400 do
      local ok, sw = pcall(store.read, dir, { partial_ok = true })
      if ok and #sw.cells >= 10 then break end
      os.execute("sleep 0.02")
    end
    os.execute("kill -INT " .. pid .. " 2>/dev/null")
    for _ = 1, 200 do -- until it has exited
      if not os.execute("kill -0 " .. pid .. " 2>/dev/null") then break end
      os.execute("sleep 0.05")
    end
    local kept = store.read(dir, { partial_ok = true })
    assert.equal("partial", kept.manifest.status, "the sweep finished before Ctrl-C reached it")
    local k = #kept.cells
    assert.equal(string.format("ember: interrupted: %d cells saved, rerun the same command to resume\n", k),
      read(work .. "/err"))
    local code, _, err = C.ember(table.unpack(args))
    assert.equal(0, code, err)
    assert.matches(string.format("(%d computed now, %d resumed)", 64 * 4 - k, k), err, 1, true)
    fs.remove_tree(work)
  end)

  it("says the same for --jobs when Ctrl-C reaches the whole process group, and the rerun resumes", function()
    local model = fx.root .. "/parity/llama-tiny-f32/model.gguf"
    if not fx.exists(model) then pending("missing " .. model) end
    if not fx.exists(launcher) then pending("missing " .. launcher) end
    if not os.execute("command -v setsid >/dev/null 2>&1") then pending("setsid (util-linux) is missing") end
    local work = tmpdir()
    local dir = work .. "/jobs"
    -- --checkpoint 0: each shard writes every cell, so the cells are seen as they are made. With the
    -- default (1 s) a shard on an idle core (128 cells in about 0.4 s of CPU) makes its first write
    -- at its end, and Ctrl-C came after the sweep had finished (256 cells, a merged --out)
    local args = { "sweep", "--model", model, "--clean", clean, "--corrupted", corrupted, "--stages", "all",
      "--threads", "1", "--no-plot", "--progress", "none", "--checkpoint", "0", "--jobs", "2", "--out", dir }
    local line = { launcher }
    for _, a in ipairs(args) do line[#line + 1] = q(a) end
    -- a session of its own, so the signal goes to the parent and its shards as a terminal's would
    os.execute("setsid sh -c " .. q(table.concat(line, " ") .. " 2>" .. q(work .. "/err")) .. " & echo $! >"
      .. q(work .. "/pid"))
    local pgid = read(work .. "/pid"):match("%d+")
    local function cells()
      local n = 0
      for i = 0, 1 do
        local ok, sw = pcall(store.read, dir .. ".shards/" .. i, { partial_ok = true })
        if ok then n = n + #sw.cells end
      end
      return n
    end
    for _ = 1, 3000 do -- up to a minute: a loaded machine starts the shards slowly
      if cells() >= 10 then break end
      os.execute("sleep 0.02")
    end
    os.execute("kill -s INT -- -" .. pgid .. " 2>/dev/null")
    for _ = 1, 200 do
      if not os.execute("kill -s 0 -- -" .. pgid .. " 2>/dev/null") then break end
      os.execute("sleep 0.05")
    end
    local k = cells()
    assert.is_true(k >= 10 and k < 256, string.format("cells saved: %d (256: the sweep finished before Ctrl-C "
      .. "reached it); stderr: %s", k, read(work .. "/err")))
    assert.equal(string.format("ember: sweep --jobs: interrupted: %d cells saved in 2 shards, rerun the same command "
      .. "to resume\n", k), read(work .. "/err"))
    -- the same command again (through the launcher: --jobs starts `ember` processes)
    assert.is_true(os.execute(table.concat(line, " ") .. " 2>" .. q(work .. "/err2")) == true, read(work .. "/err2"))
    assert.equal("complete", store.read(dir).manifest.status)
    fs.remove_tree(work)
  end)

  it("merges shards of a cancelled job into nothing, naming what is missing and the commands that complete it",
    function()
      local path = need_model()
      if not fx.exists(launcher) then pending("missing " .. launcher) end
      local work = tmpdir()
      local base = work .. "/S.shards"
      assert(fs.mkdir(base))
      local function shard(k, extra)
        local code, _, err = C.ember("sweep", "--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED,
          "--threads", "1", "--no-plot", "--progress", "none", "--shard", k .. "/4", "--out", base .. "/" .. k,
          table.unpack(extra or {}))
        assert.equal(0, code, err)
      end
      -- shard 0 and 2 finished, 1 was cancelled after its first cell, 3 never started
      shard(0)
      shard(1, { "--max-cells", "1" })
      shard(2)
      local dirs = { base .. "/0", base .. "/1", base .. "/2", base .. "/3" }
      local code, _, err = C.ember("sweep", "merge", work .. "/S", table.unpack(dirs))
      assert.equal(1, code)
      assert.is_false(fs.exists(work .. "/S"))
      -- 24 cells (2 layers x 12 positions): shard 1 of 4 computes cells 1, 5, ..., 21
      local want = {
        "sweep merge: 2 of 4 shards are not complete:",
        string.format("'%s/3' does not exist (its task never ran, or was cancelled before its first write)", base),
        string.format("shard 1/4 ('%s/1'): partial, 1 of 6 cells", base),
        "shard 3/4: missing (no directory given holds it)",
      }
      for _, w in ipairs(want) do assert.matches(w, err, 1, true) end
      -- the commands it prints complete the sweep (run here through the launcher)
      local cmds = {}
      for c in err:gmatch("\n  (ember sweep [^\n]+)") do cmds[#cmds + 1] = c end
      assert.equal(2, #cmds)
      local function ends(c, tail) return c:sub(-#tail) == tail end
      assert.is_true(ends(cmds[1], "--shard 1/4 --out " .. base .. "/1"), cmds[1])
      assert.is_true(ends(cmds[2], "--shard 3/4 --out " .. base .. "/3"), cmds[2])
      for _, c in ipairs(cmds) do
        assert.is_true(os.execute(launcher .. c:sub(#"ember" + 1) .. " 2>/dev/null") == true, c)
      end
      code, _, err = C.ember("sweep", "merge", work .. "/S", table.unpack(dirs))
      assert.equal(0, code, err)
      assert.equal("complete", store.read(work .. "/S").manifest.status)
      fs.remove_tree(work)
    end)
end)

teardown(function() fx.cleanup() end)
