-- The causal workflow end to end: capture, zero, patch, restore (SPEC §6.4) on the default tiny
-- model, on one parity fixture per family and on a Q4_K_M model; capture selection; and every way
-- a patch must fail.
-- Results are checked by reading the artifacts' manifests here with cjson, not only through the
-- workflow's own report.

local cjson = require("cjson")
local ember = require("ember")
local artifact = require("ember.store.artifact")
local capture = require("ember.run.capture")
local compare = require("ember.analysis.compare")
local compose = require("ember.run.compose")
local patch = require("ember.run.patch")
local run = require("ember.run")
local workflow = require("ember.run.workflow")
local models = require("helpers.models")
local H = require("helpers.artifacts")

local ALLOWED = { "experiment", "capture.config", "capture.config_sha256", "argv", "created_at_unix",
  "capture.output_dir" }

-- Generating N tokens costs one prefill and N decode evaluations (SPEC §4.1): every generated
-- token, the last one included, is evaluated once. The runs below generate N = MAX_TOKENS tokens.
local MAX_TOKENS = 4
local EVALUATIONS = 1 + MAX_TOKENS

local function manifest_of(dir) return cjson.decode(H.read(dir .. "/manifest.json")) end

-- after_logits sha256 per (phase, start_position), read straight from manifest.json
local function logits_hashes(dir)
  local out, n = {}, 0
  for _, r in ipairs(manifest_of(dir).records) do
    if r.stage == "after_logits" then
      out[r.phase .. "@" .. math.tointeger(r.start_position)] = r.sha256
      n = n + 1
    end
  end
  return out, n
end

local function check_restoration(model, opts)
  local out_dir = H.tmpdir() .. "/cpr"
  local report = workflow.capture_patch_restore {
    model = model, tokenizer_path = opts.tokenizer, prompt = opts.prompt, layer = opts.layer, max_tokens = MAX_TOKENS,
    out_dir = out_dir,
  }
  -- A/B: the zeroed MLP changes tensors from layer L on; weaker than exact-semantic
  assert.is_false(compare.at_least(report.ab.class, "exact-semantic"), report.ab.class)
  local first_diff
  for _, r in ipairs(report.ab.records) do
    if r.status ~= "identical" then first_diff = r; break end
  end
  assert.equal("after_mlp", first_diff.stage)
  assert.equal(opts.layer, first_diff.layer)
  -- A/C: exact-semantic or stricter, every record bit-identical
  assert.is_true(compare.at_least(report.ac.class, "exact-semantic"), report.ac.class .. ": " .. report.ac.reason)
  assert.equal(report.ac.summary.aligned, report.ac.summary.identical)
  -- captured logits equal by sha256, from the manifests themselves
  local la, na = logits_hashes(out_dir .. "/A")
  local lc, nc = logits_hashes(out_dir .. "/C")
  assert.equal(EVALUATIONS, na) -- one after_logits record per evaluation
  assert.equal(na, nc)
  assert.same(la, lc)
  local ma, mb, mc = manifest_of(out_dir .. "/A"), manifest_of(out_dir .. "/B"), manifest_of(out_dir .. "/C")
  -- decode evaluations sit at positions P .. P+N-1: the last generated token's one included
  local P = #ma.input_ids
  for k = 1, MAX_TOKENS do assert.is_not_nil(la["decode@" .. (P + k - 1)], "decode @" .. (P + k - 1)) end
  assert.same(ma.generated_ids, mc.generated_ids)
  assert.equal(ma.model.sha256, mc.model.sha256)
  assert.equal(ma.prompt.sha256, mc.prompt.sha256)
  assert.same(ma.input_ids, mc.input_ids)
  assert.equal("zero-layer-output+capture", mb.experiment.name)
  assert.equal("activation-patch+capture", mc.experiment.name)
  -- only the documented provenance fields differ between A and C
  for _, d in ipairs(report.ac.provenance_differences) do
    local ok = false
    for _, p in ipairs(ALLOWED) do
      if d.path == p or d.path:sub(1, #p + 1) == p .. "." then ok = true end
    end
    assert.is_true(ok, "unexpected provenance difference " .. d.path)
  end
  assert.is_true(report.ok)
  return report
end

describe("capture_patch_restore", function()
  after_each(H.cleanup)

  it("holds on the default tiny model (layer 4)", function()
    local model, why = models.default()
    if not model then return pending("default tiny model unavailable: " .. tostring(why)) end
    local report = check_restoration(model, { prompt = models.PROMPT, layer = 4 })
    assert.equal(EVALUATIONS, report.patch_applied) -- prefill + every decode
    assert.matches("restoration criterion: HOLDS", workflow.format(report, model.info), 1, true)
  end)

  for _, c in ipairs(models.family_cases()) do
    it("holds on the " .. c.family .. " parity fixture (" .. c.case .. ")", function()
      if c.missing then return pending("missing fixture " .. c.missing) end
      local model, err = models.load(c.model, c.tokenizer)
      if not model then return pending(c.case .. " does not load yet: " .. err) end
      local layer = math.max(0, math.min(4, model.info.n_layers - 2))
      check_restoration(model, { prompt = c.prompt, tokenizer = c.tokenizer, layer = layer })
    end)
  end

  -- The families' variants that family_cases' one case per family does not reach.
  for _, case in ipairs({ "gptneox-seq-tiny-q8_0" }) do
    it("holds on " .. case .. " (a variant of its family)", function()
      local fx = require("helpers.fixtures")
      local dir = fx.families_dir .. "/" .. case
      if not fx.exists(dir .. "/case.json") then return pending("missing fixture " .. dir .. "/case.json") end
      local path, why = fx.case_model(dir)
      if not path then return pending(why) end
      local model, err = models.load(path)
      assert.is_not_nil(model, err)
      check_restoration(model, { prompt = models.PROMPT, layer = math.max(0, math.min(4, model.info.n_layers - 2)) })
    end)
  end

  -- Weights in llama.cpp's Q4_K_M mix (q4_K and q6_K tensors): hooks see f32 activations as ever.
  it("holds on a Q4_K_M model (parity-quant llama-small-q4_k_m)", function()
    local fx = require("helpers.fixtures")
    local dir = fx.root .. "/parity-quant/llama-small-q4_k_m"
    if not fx.exists(dir .. "/model.gguf") then return pending("missing fixture " .. dir .. "/model.gguf") end
    local meta = fx.read_json(dir .. "/case.json")
    local model, err = models.load(dir .. "/model.gguf", dir .. "/tokenizer.json")
    assert.is_not_nil(model, err)
    assert.equal("q4_K+q6_K", model.info.dtype_summary)
    check_restoration(model, { prompt = meta.prompt_text, tokenizer = dir .. "/tokenizer.json", layer = 2 })
  end)

  it("exits non-zero with a clear message when run as a script on a layer the model lacks", function()
    local path, why = models.default_model()
    if not path then return pending(tostring(why)) end
    -- the same stock interpreter and module paths busted runs with; its own TMPDIR to see leftovers
    local tmp = H.tmpdir()
    local cmd = string.format("TMPDIR=%s LUA_PATH=%s LUA_CPATH=%s lua5.4 scripts/workflows/capture_patch_restore.lua "
      .. "--model %s --layer 99 2>&1; echo \"rc=$?\"", H.shell_quote(tmp), H.shell_quote(package.path),
      H.shell_quote(package.cpath), H.shell_quote(path))
    local p = io.popen(cmd)
    local text = p:read("a")
    p:close()
    assert.matches("layer 99 is out of range", text, 1, true)
    assert.matches("rc=1", text, 1, true)
    assert.same({}, H.listdir(tmp))
  end)
end)

describe("generate.lua", function()
  local function script(args)
    local cmd = string.format("LUA_PATH=%s LUA_CPATH=%s lua5.4 scripts/workflows/generate.lua %s 2>&1; echo \"rc=$?\"",
      H.shell_quote(package.path), H.shell_quote(package.cpath), args)
    local p = io.popen(cmd)
    local text = p:read("a")
    p:close()
    return text
  end

  it("prints the prompt and its greedy continuation, as generate() computes it", function()
    local model, why = models.default()
    if not model then return pending("default tiny model unavailable: " .. tostring(why)) end
    local text = script("--model " .. H.shell_quote(model.info.path) .. " --prompt " .. H.shell_quote(models.PROMPT)
      .. " --max-tokens 6")
    local want = model:generate { prompt = models.PROMPT, max_tokens = 6, temperature = 0 }
    assert.equal(models.PROMPT .. want.text .. "\nrc=0\n", text)
  end)

  it("names a bad flag and exits 2", function()
    local text = script("--model m.gguf --max-tokens lots")
    assert.matches("--max-tokens: expected a non-negative integer", text, 1, true)
    assert.matches("rc=2", text, 1, true)
  end)
end)

describe("restoration evidence", function()
  after_each(H.cleanup)

  local model, why
  local function need()
    if model == nil and why == nil then model, why = models.default() end
    if not model then pending("default tiny model unavailable: " .. tostring(why)) end
    return model
  end
  local cfg = assert(capture.config {})
  local function session(dir, experiments, max_tokens)
    return run.execute { model = model, prompt = models.PROMPT,
      gen = { max_tokens = max_tokens or MAX_TOKENS, temperature = 0 },
      experiments = experiments, capture = { config = cfg, dir = dir }, argv = { "spec" } }
  end

  it("equal generated text with different tensors is not exact", function()
    if not need() then return end
    -- lowers one logit that is not the maximum: greedy ids (and text) cannot change, tensors do
    local nudge = { name = "nudge-logits" }
    function nudge:after_logits(_, logits)
      local top = logits:argmax()
      local col = top == 1 and 2 or 1
      logits:set(1, col, logits:get(1, col) - 1.0)
    end
    local base = H.tmpdir()
    local a = session(base .. "/A", {})
    local b = session(base .. "/B", { nudge })
    assert.same(a.out.ids, b.out.ids)
    assert.equal(a.out.text, b.out.text)
    local res = compare.compare_dirs(base .. "/A", base .. "/B")
    assert.equal("output-equivalent", res.class)
    assert.is_false(compare.at_least(res.class, "exact-semantic"))
    assert.equal(EVALUATIONS, res.summary.differing) -- the after_logits record of every evaluation
  end)

  it("zeroing and then patching the same target restores the baseline bit for bit", function()
    if not need() then return end
    local base = H.tmpdir()
    session(base .. "/A", {})
    local zero = dofile("scripts/experiments/zero_layer_output.lua")({ target = "4:mlp", notice = function() end })
    local p = patch.experiment { source = base .. "/A", target = { layer = 4, stage = "after_mlp" }, model = model }
    session(base .. "/D", { zero, p })
    assert.equal(EVALUATIONS, zero.stats.interventions)
    assert.equal(EVALUATIONS, p.stats.applied)
    local res = compare.compare_dirs(base .. "/A", base .. "/D")
    assert.equal("exact-semantic", res.class)
  end)

  it("the same run repeated is exact", function()
    if not need() then return end
    local base = H.tmpdir()
    session(base .. "/A", {})
    session(base .. "/A2", {})
    -- argv, experiment and config are equal; only the output directory (and maybe the clock) differ
    assert.equal("exact", compare.compare_dirs(base .. "/A", base .. "/A2").class)
  end)
end)

describe("capture selection", function()
  after_each(H.cleanup)

  local model
  local function need()
    if model == nil then model = models.default() end
    if not model then pending("default tiny model unavailable") end
    return model
  end

  local function keys_of(dir)
    local out = {}
    for _, r in ipairs(manifest_of(dir).records) do
      out[#out + 1] = string.format("%s|%s|%s|%d", r.stage, r.layer == cjson.null and "-" or math.tointeger(r.layer),
        r.phase, math.tointeger(r.start_position))
    end
    return out
  end

  it("captures exactly the selected layers, stages, phases and decode positions", function()
    if not need() then return end
    local dir = H.tmpdir() .. "/cap"
    local P = #model:tokenize(models.PROMPT)
    local cfg = assert(capture.config { layers = "1,3", stages = "after_logits,after_mlp",
      positions = tostring(P + 1) })
    run.execute { model = model, prompt = models.PROMPT, gen = { max_tokens = 4, temperature = 0 },
      capture = { config = cfg, dir = dir }, argv = { "spec" } }
    -- prefill always whole; decode only at position P+1; logits regardless of the layer filter
    assert.same({
      "after_mlp|1|prefill|0", "after_mlp|3|prefill|0", "after_logits|-|prefill|0",
      "after_mlp|1|decode|" .. (P + 1), "after_mlp|3|decode|" .. (P + 1), "after_logits|-|decode|" .. (P + 1),
    }, keys_of(dir))
    local m = manifest_of(dir)
    assert.same({ P, model.info.hidden_size }, m.records[1].shape)
    assert.same({ 1, model.info.n_vocab }, m.records[3].shape)
  end)

  it("honours the phase filter and the record cap, and says how many records the cap dropped", function()
    if not need() then return end
    local dir = H.tmpdir() .. "/cap"
    local cap = 2
    local cfg = assert(capture.config { phase = "decode", stages = "before_logits", max_records = cap })
    local r = run.execute { model = model, prompt = models.PROMPT, gen = { max_tokens = MAX_TOKENS, temperature = 0 },
      capture = { config = cfg, dir = dir }, argv = { "spec" } }
    local keys = keys_of(dir)
    assert.equal(cap, #keys)
    for _, k in ipairs(keys) do assert.matches("^before_logits|%-|decode|", k) end
    -- one before_logits per decode evaluation (MAX_TOKENS of them); the cap keeps the first two
    assert.equal(MAX_TOKENS - cap, r.capture.stats.dropped)
    assert.equal(MAX_TOKENS - cap, manifest_of(dir).capture.dropped_records)
  end)

  it("withholds the prompt text on request but keeps its sha256", function()
    if not need() then return end
    local dir = H.tmpdir() .. "/cap"
    local cfg = assert(capture.config { stages = "after_logits", omit_prompt = true })
    run.execute { model = model, prompt = models.PROMPT, gen = { max_tokens = 2, temperature = 0 },
      capture = { config = cfg, dir = dir }, argv = { "spec" } }
    local text = H.read(dir .. "/manifest.json")
    assert.is_nil(text:find(models.PROMPT, 1, true))
    local m = cjson.decode(text)
    assert.equal(cjson.null, m.prompt.text)
    assert.is_true(m.prompt.withheld)
    local oracle = H.sha256sum(models.PROMPT)
    if oracle then assert.equal(oracle, m.prompt.sha256) end
  end)

  it("rejects selections that cannot be captured", function()
    if not need() then return end
    assert.is_nil(capture.config { stages = "after_mpl" })
    assert.is_nil(capture.config { max_records = 0 })
    local cfg = assert(capture.config { layers = "2," .. model.info.n_layers })
    local ok, err = capture.check(cfg, model.info)
    assert.is_nil(ok)
    assert.matches("layer " .. model.info.n_layers .. " is out of range", err, 1, true)
  end)
end)

describe("activation patch failures", function()
  after_each(H.cleanup)

  local model, src_dir
  local function need()
    if model == nil then model = models.default() end
    if not model then pending("default tiny model unavailable") return nil end
    if not src_dir then
      src_dir = os.tmpname()
      os.remove(src_dir)
      run.execute { model = model, prompt = models.PROMPT, gen = { max_tokens = MAX_TOKENS, temperature = 0 },
        capture = { config = assert(capture.config { stages = "after_mlp,after_logits" }), dir = src_dir },
        argv = { "spec" } }
    end
    return model
  end
  teardown(function() if src_dir then os.execute("rm -rf " .. H.shell_quote(src_dir)) end end)

  local function patch_error(opts)
    local ok, err = pcall(patch.experiment, opts)
    assert.is_false(ok, "expected the patch setup to fail")
    return tostring(err)
  end

  local function gen_with(p, max_tokens)
    return model:generate { prompt = models.PROMPT, max_tokens = max_tokens or MAX_TOKENS, temperature = 0,
      experiment = p }
  end

  -- a copy of the source artifact with its records changed by `edit`
  local function edited_source(edit, sections_edit)
    local a = artifact.read(src_dir)
    local recs = {}
    for _, r in ipairs(a.records) do
      recs[#recs + 1] = { stage = r.stage, layer = r.layer, phase = r.phase, start_position = r.start_position,
        shape = { r.shape[1], r.shape[2] }, data = r.tensor:bytes() }
    end
    if edit then edit(recs) end
    local m = a.manifest
    local s = { created_at_unix = m.created_at_unix, tool = m.tool, model = m.model, tokenizer = m.tokenizer,
      prompt = m.prompt, input_ids = m.input_ids, generated_ids = m.generated_ids, settings = m.settings,
      execution = m.execution, experiment = m.experiment, capture = m.capture, argv = m.argv }
    if sections_edit then sections_edit(s) end
    local dir = H.tmpdir() .. "/src"
    artifact.write(dir, s, recs)
    return dir
  end

  it("applies once per evaluation when the source matches", function()
    if not need() then return end
    local p = patch.experiment { source = src_dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    local out = gen_with(p)
    assert.is_true(out.modified)
    assert.equal(EVALUATIONS, p.stats.applied)
    assert.equal(1, p.stats.prefill)
    assert.equal(MAX_TOKENS, p.stats.decode)
  end)

  it("refuses an ambiguous source", function()
    if not need() then return end
    local dir = edited_source(function(recs)
      for _, r in ipairs(recs) do
        if r.stage == "after_mlp" and r.layer == 2 and r.phase == "prefill" then
          recs[#recs + 1] = { stage = r.stage, layer = r.layer, phase = r.phase, start_position = r.start_position,
            shape = r.shape, data = r.data }
          break
        end
      end
    end)
    local err = patch_error { source = dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    assert.matches("ambiguous source", err, 1, true)
    assert.matches("after_mlp layer 2 prefill @0", err, 1, true)
  end)

  it("refuses a source without the target", function()
    if not need() then return end
    local err = patch_error { source = src_dir, target = { layer = 2, stage = "after_attention" }, model = model }
    assert.matches("no source record for after_attention layer 2", err, 1, true)
  end)

  it("refuses a source of another width or family", function()
    if not need() then return end
    local hidden = model.info.hidden_size
    local dir = edited_source(function(recs)
      for _, r in ipairs(recs) do
        if r.stage == "after_mlp" then
          r.shape = { r.shape[1], hidden // 2 }
          r.data = r.data:sub(1, r.shape[1] * (hidden // 2) * 4)
        end
      end
    end)
    local err = patch_error { source = dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    assert.matches("width mismatch", err, 1, true)
    assert.matches((hidden // 2) .. " columns, the model's hidden size is " .. hidden, err, 1, true)
    dir = edited_source(nil, function(s) s.model = { sha256 = s.model.sha256, family = "qwen3" } end)
    err = patch_error { source = dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    assert.matches("family mismatch", err, 1, true)
    assert.matches("qwen3", err, 1, true)
  end)

  it("refuses a source whose dtype is not f32", function()
    if not need() then return end
    local dir = edited_source()
    local text = H.read(dir .. "/manifest.json")
    H.write(dir .. "/manifest.json", (text:gsub('"dtype": "f32"', '"dtype": "f16"', 1)))
    local err = patch_error { source = dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    assert.matches("unsupported dtype 'f16'", err, 1, true)
  end)

  it("refuses corrupted tensor bytes (sha256 mismatch)", function()
    if not need() then return end
    local dir = edited_source()
    local path = dir .. "/tensors.safetensors"
    local s = H.read(path)
    local n = string.unpack("<I8", s)
    local pos = 8 + n + 3 -- a byte of the first tensor's data
    H.write(path, s:sub(1, pos - 1) .. string.char(s:byte(pos) ~ 0x40) .. s:sub(pos + 1))
    local err = patch_error { source = dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    assert.matches("sha256 mismatch", err, 1, true)
  end)

  it("fails the run when a source record is never applied", function()
    if not need() then return end
    local p = patch.experiment { source = src_dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    local ok, err = pcall(gen_with, p, 2) -- the source has MAX_TOKENS (4) decode records; this run makes 2 decodes
    assert.is_false(ok)
    err = tostring(err)
    assert.matches("experiment 'activation-patch' failed in on_generation_complete", err, 1, true)
    assert.matches("was never applied", err, 1, true)
  end)

  it("fails the run at the first evaluation the source does not cover", function()
    if not need() then return end
    local p = patch.experiment { source = src_dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    local ok, err = pcall(gen_with, p, 6) -- 6 decodes; the source covers MAX_TOKENS (4)
    assert.is_false(ok)
    err = tostring(err)
    assert.matches("failed in after_mlp (phase=decode, layer=2)", err, 1, true)
    assert.matches("no source record for after_mlp layer 2 decode", err, 1, true)
  end)

  it("refuses a prompt of another length (rows differ)", function()
    if not need() then return end
    local p = patch.experiment { source = src_dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    local ok, err = pcall(function()
      return model:generate { prompt = models.PROMPT .. " And more.", max_tokens = 4, temperature = 0, experiment = p }
    end)
    assert.is_false(ok)
    assert.matches("shape mismatch", tostring(err), 1, true)
  end)

  it("allocates nothing inside the hook after setup", function()
    if not need() then return end
    local p = patch.experiment { source = src_dir, target = { layer = 2, stage = "after_mlp" }, model = model }
    local inner = p.after_mlp
    local grew = {}
    -- measure the Lua heap around the patch hook body only (contexts and views are the runtime's)
    p.after_mlp = function(self, ctx, view)
      collectgarbage("stop")
      local before = collectgarbage("count")
      inner(self, ctx, view)
      local after = collectgarbage("count")
      collectgarbage("restart")
      grew[#grew + 1] = after - before
    end
    gen_with(p)
    assert.equal(EVALUATIONS * model.info.n_layers, #grew) -- after_mlp: every layer of every evaluation
    for i, kb in ipairs(grew) do assert.equal(0, kb, "allocation in call " .. i) end
  end)
end)

-- the tiny models made for this file
teardown(function() require("helpers.fixtures").cleanup() end)
