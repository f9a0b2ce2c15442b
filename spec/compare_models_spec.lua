-- ember compare-models on the F32 and Q8_0 parity fixtures of one family and seed (they share their
-- unquantized weights): a per-layer divergence table, patching after_logits from A makes B's
-- logits A's exactly, and the last layer's after_layer recovers more than layer 0's.

local cjson = require("cjson")
local ember = require("ember")
local artifact = require("ember.store.artifact")
local cm = require("ember.analysis.compare_models")
local fs = require("ember.store.fs")
local patch = require("ember.run.patch")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")

local PROMPT = "The quick brown fox jumps over the lazy dog."

local function pair(family)
  local a = fx.root .. "/parity/" .. family .. "-tiny-f32/model.gguf"
  local b = fx.root .. "/parity/" .. family .. "-tiny-q8_0/model.gguf"
  if not fx.exists(a) or not fx.exists(b) then pending("missing parity fixtures " .. a .. " / " .. b) end
  return a, b
end

local read = require("helpers.files").read

describe("compare-models", function()
  for _, family in ipairs({ "llama", "qwen3" }) do
    it("localises the " .. family .. " F32 -> Q8_0 divergence", function()
      local pa, pb = pair(family)
      local a, b = ember.load { model = pa, threads = 1 }, ember.load { model = pb, threads = 1 }
      local r = cm.run { a = a, b = b, prompt = PROMPT, max_tokens = 3 }
      local L = a.info.n_layers
      assert.equal(4, r.evaluations) -- prefill + 3 decodes
      -- one divergence row per stage and layer (plus the two logits stages), each measured
      assert.equal(4 * L + 2, #r.divergence)
      for _, row in ipairs(r.divergence) do
        assert.is_true(row.prefill.rel_l2 > 0, row.stage)
        assert.is_true(row.prefill.cosine > 0.9 and row.prefill.cosine <= 1 + 1e-12, row.stage)
        assert.equal(3, row.decode.steps)
      end
      assert.is_true(r.output.kl_prefill > 0)
      local by = {}
      for _, l in ipairs(r.localisation) do by[l.stage .. (l.layer == cjson.null and "" or l.layer)] = l end
      -- A's logits patched into B: B's outputs are A's, bit for bit, in prefill and every decode
      local lg = by["after_logits"]
      assert.is_true(lg.logits_exact)
      assert.equal(0.0, lg.kl_prefill)
      assert.equal(0.0, lg.kl_decode)
      assert.equal(1.0, lg.top1_agreement)
      -- the last layer's finished state carries more of A's computation than layer 0's
      local first, last = by["after_layer0"], by["after_layer" .. (L - 1)]
      assert.is_true(last.recovered_prefill > first.recovered_prefill)
      assert.is_true(last.recovered_decode > first.recovered_decode)
      assert.is_true(last.kl_prefill < r.output.kl_prefill)
    end)
  end

  it("explains negative recovered shares: every row whose patched KL exceeds B's own, and only those", function()
    local pa, pb = pair("llama")
    local a, b = ember.load { model = pa, threads = 1 }, ember.load { model = pb, threads = 1 }
    local r = cm.run { a = a, b = b, prompt = "The quick brown fox", max_tokens = 4, stages = { "before_layer" } }
    -- the rows with a negative share, found here from the KLs themselves
    local want = {}
    for _, l in ipairs(r.localisation) do
      for _, ph in ipairs({ "prefill", "decode" }) do
        local kl, base = l["kl_" .. ph], r.output["kl_" .. ph]
        if kl ~= cjson.null and base ~= cjson.null and base > 0 and kl > base then
          want[#want + 1] = string.format("%s %s %s:", l.stage, l.layer == cjson.null and "-" or l.layer, ph)
        end
      end
    end
    local notes = cm.notes(r)
    local text, report = cm.format(r), cjson.decode(cm.to_json(r))
    if #want == 0 then
      assert.same({}, notes)
      assert.is_nil(text:find("note:", 1, true))
    else
      assert.equal(1, #notes)
      local shown = math.min(#want, cm.NOTE_ROWS)
      for i = 1, shown do assert.truthy(notes[1]:find(want[i], 1, true), want[i]) end
      local _, named = notes[1]:gsub(" %l+: %-%d", "")
      assert.equal(shown, named)
      if #want > shown then assert.truthy(notes[1]:find(string.format("; and %d more)", #want - shown), 1, true)) end
      assert.truthy(text:find("\nnote: a negative recovered share", 1, true))
    end
    assert.same(notes, report.notes)
    -- the same on a report made by hand: one negative share, one positive
    local hand = { output = { kl_prefill = 0.5, kl_decode = 0.25 }, localisation = {
      { stage = "after_layer", layer = 0, kl_prefill = 0.75, kl_decode = 0.125, recovered_prefill = -0.5,
        recovered_decode = 0.5 } } }
    assert.same({ "a negative recovered share (after_layer 0 prefill: -0.5 (KL 0.75 against B's own 0.5)) means "
      .. "that B with A's activation patched in is further from A than B alone. B's error is not a sum of "
      .. "independent errors, one per layer: the rounding below the patched point (the embedding, the lower layers) "
      .. "partly cancels the rounding above it, so giving B's upper layers A's exact input removes an error that was "
      .. "offsetting theirs. Shares are ratios of small KLs: read them with the KL columns (docs/sweeps.md, "
      .. "compare-models)." }, cm.notes(hand))
  end)

  it("measures the recovered share of a logit difference when given --metric (prefill, by hand)", function()
    local pa, pb = pair("llama")
    local a, b = ember.load { model = pa, threads = 1 }, ember.load { model = pb, threads = 1 }
    local ids = a:tokenize(PROMPT)
    local top = a:session {}:prefill(ids):token_argmax()
    local other = top == 0 and 1 or 0
    local r = cm.run { a = a, b = b, ids = ids, max_tokens = 0,
      metric = { kind = "logit-diff", tokens = { top, other } } }
    assert.same({ top, other }, r.metric.tokens)
    -- the metric of a prefill, and the same with A's after_layer of layer 1 written into B by a hook here
    local function ld(t) return t:get(1, top + 1) - t:get(1, other + 1) end
    local keep = { name = "keep" }
    function keep:after_layer(ctx, v) if ctx.layer_index == 1 then self.row = v:clone() end end
    local va = ld(a:session {}:prefill(ids, { experiment = keep }))
    local vb = ld(b:session {}:prefill(ids))
    local put = { name = "put" }
    function put:after_layer(ctx, v)
      if ctx.layer_index == 1 then
        for rr = 1, v:shape()[1] do for c = 1, v:shape()[2] do v:set(rr, c, keep.row:get(rr, c)) end end
      end
    end
    local vp = ld(b:session {}:prefill(ids, { experiment = put }))
    assert.equal(va, r.output.metric_a.prefill)
    assert.equal(vb, r.output.metric_b.prefill)
    local row
    for _, l in ipairs(r.localisation) do if l.stage == "after_layer" and l.layer == 1 then row = l end end
    assert.equal(vp, row.metric_prefill)
    assert.is_true(math.abs(row.recovered_prefill - (vp - vb) / (va - vb)) < 1e-12)
    local last = r.localisation[#r.localisation]
    assert.equal(1.0, last.recovered_prefill) -- A's logits in B: A's value exactly
    local text = cm.format(r)
    assert.truthy(text:find("metric: " .. r.metric.label, 1, true))
    assert.truthy(text:find("share of the gap from B's logit-diff to A's recovered", 1, true))
    local doc = cjson.decode(cm.to_json(r))
    assert.equal("logit-diff", doc.metric.kind)
    assert.equal(vp, doc.localisation[2].metric_prefill) -- cells in order: after_layer 0, 1, ...
  end)

  it("agrees with an independent after_logits patch from a captured artifact", function()
    local pa, pb = pair("llama")
    local work = fs.make_temp_dir("ember-cm-spec")
    local dir = work .. "/a"
    local code, _, err = C.ember("--model", pa, "--prompt", PROMPT, "--max-tokens", "0", "--capture-activations", dir,
      "--capture-stages", "after_logits", "--run-manifest", work .. "/run.json")
    assert.equal(0, code, err)
    local a, b = ember.load { model = pa, threads = 1 }, ember.load { model = pb, threads = 1 }
    local ids = a:tokenize(PROMPT)
    local want = a:session {}:prefill(ids)
    local plain = b:session {}:prefill(ids)
    assert.are_not.equal(want:sha256(), plain:sha256())
    -- A's artifact into B: another model's source, which must be asked for
    local refused, why = pcall(patch.experiment, { source = artifact.read(dir), target = { stage = "after_logits" },
      model = b })
    assert.is_false(refused)
    assert.matches("captured from another model", why, 1, true)
    local p = patch.experiment { source = artifact.read(dir), target = { stage = "after_logits" }, model = b,
      allow_foreign_source = true }
    assert.is_true(p.details.foreign_source)
    local got = b:session {}:prefill(ids, { experiment = p })
    assert.equal(want:sha256(), got:sha256())
    fs.remove_tree(work)
  end)

  it("writes a JSON report and the divergence plots as SVG and PNG (command)", function()
    local pa, pb = pair("llama")
    local out = fs.make_temp_dir("ember-cm-cli") .. "/report"
    local code, text, err = C.ember("compare-models", pa, pb, "--prompt", PROMPT, "--max-tokens", "2", "--out", out,
      "--threads", "1")
    assert.equal(0, code, err)
    assert.matches("per-layer divergence", text, 1, true)
    assert.matches("after_logits %s+%-.-logits exact", text)
    local r = cjson.decode(read(out .. "/report.json"))
    assert.equal("ember.compare-models", r.schema)
    assert.equal(r.a.dtype, "f32")
    assert.equal(r.b.dtype, "q8_0")
    if r.plot == nil then pending("plots not drawn (gnuplot missing?): " .. err) end
    for i, base in ipairs({ "divergence", "recovery" }) do
      local svg = read(out .. "/" .. base .. ".svg")
      assert.equal("\137PNG\r\n\26\n", read(out .. "/" .. base .. ".png"):sub(1, 8))
      if os.execute("command -v rsvg-convert >/dev/null 2>&1") then -- the SVG opens in another renderer
        local png = out .. "/check-" .. base .. ".png"
        assert.is_true(os.execute("rsvg-convert -o " .. png .. " " .. out .. "/" .. base .. ".svg") == true)
        assert.equal("\137PNG\r\n\26\n", read(png):sub(1, 8))
      end
      for _, label in ipairs({ r.plot.titles[i], r.plot.xlabels[i], r.plot.ylabels[i] }) do
        assert.truthy(svg:find(">" .. label:gsub("&", "&amp;") .. "<", 1, true), base .. ".svg lacks " .. label)
      end
    end
    fs.remove_tree(fs.dirname(out))
  end)

  it("takes --metric with token strings as the sweep does: the same report as with their ids (command)", function()
    local pa, pb = pair("llama")
    local m = ember.load { model = pa, threads = 1 }
    local function one(text) -- the id, found here: each of these is one token of the fixture's vocabulary
      local ids = m:tokenize(text, { bos = false })
      assert.equal(1, #ids, text)
      return ids[1]
    end
    local qu, over, n_fox = one(" qu"), one(" over"), #m:tokenize(" fox", { bos = false })
    m:close()
    local work = fs.make_temp_dir("ember-cm-metric")
    local function run(dir, metric)
      local code, _, err = C.ember("compare-models", pa, pb, "--prompt", PROMPT, "--max-tokens", "1", "--threads", "1",
        "--metric", metric, "--out", work .. "/" .. dir, "--no-plot")
      return code, err, code == 0 and cjson.decode(read(work .. "/" .. dir .. "/report.json")) or nil
    end
    local code, err, by_ids = run("ids", string.format("logit-diff:%d,%d", qu, over))
    assert.equal(0, code, err)
    local code2, err2, by_str = run("str", 'logit-diff:" qu"," over"')
    assert.equal(0, code2, err2)
    assert.same({ qu, over }, by_str.metric.tokens)
    assert.same(by_ids.localisation, by_str.localisation)
    assert.same(by_ids.output_divergence, by_str.output_divergence)
    code, err = run("many", 'prob:" fox"')
    assert.equal(1, code)
    assert.matches(string.format("metric: \" fox\" is %d tokens, not one", n_fox), err, 1, true)
    fs.remove_tree(work)
  end)

  it("refuses two different networks, naming the field", function()
    local pa = fx.root .. "/parity/llama-tiny-f32/model.gguf"
    local pq = fx.root .. "/parity/qwen3-tiny-f32/model.gguf"
    if not fx.exists(pa) or not fx.exists(pq) then pending("missing parity fixtures") end
    local a, q = ember.load { model = pa, threads = 1 }, ember.load { model = pq, threads = 1 }
    local ok, err = pcall(cm.run, { a = a, b = q, prompt = PROMPT })
    assert.is_false(ok)
    assert.matches("compare-models: the models are not the same network: family is llama in A", err, 1, true)
  end)
end)

describe("compare-models --shard and merge", function()
  it("joins 2 shards into the single-process report and refuses a shard of another prompt", function()
    local pa, pb = pair("llama")
    local work = fs.make_temp_dir("ember-cm-shards")
    local function run(dir, prompt, shard)
      local args = { "compare-models", pa, pb, "--prompt", prompt, "--max-tokens", "2", "--threads", "1", "--out",
        work .. "/" .. dir, "--no-plot" }
      if shard then args[#args + 1] = "--shard"; args[#args + 1] = shard end
      local code, _, err = C.ember(table.unpack(args))
      assert.equal(0, code, err)
      return cjson.decode(read(work .. "/" .. dir .. "/report.json"))
    end
    local single = run("single", PROMPT)
    local s0, s1 = run("s0", PROMPT, "0/2"), run("s1", PROMPT, "1/2")
    assert.equal(#single.localisation, #s0.localisation + #s1.localisation)
    for _, l in ipairs(s1.localisation) do assert.equal(1, math.tointeger(l.index) % 2) end
    local code, _, err = C.ember("compare-models", "merge", work .. "/merged", work .. "/s1", work .. "/s0")
    assert.equal(0, code, err)
    local merged = cjson.decode(read(work .. "/merged/report.json"))
    assert.same(single.localisation, merged.localisation)
    assert.same(single.divergence, merged.divergence)
    assert.same(single.output_divergence, merged.output_divergence)
    assert.truthy(fx.exists(work .. "/merged/recovery.png"))
    run("other", "Another prompt entirely", "1/2")
    code, _, err = C.ember("compare-models", "merge", work .. "/bad", work .. "/s0", work .. "/other")
    assert.equal(1, code)
    assert.matches("report 2 does not belong with report 1: prompt_ids differs", err, 1, true)
    fs.remove_tree(work)
  end)
end)
