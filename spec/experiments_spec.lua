-- The experiment files in scripts/experiments/: activation-stats observes without changing a bit,
-- zero-layer-output zeroes exactly its target in every evaluation, and the two example
-- interventions do what their headers say — each checked against an independent observer.

local cjson = require("cjson")
local ember = require("ember")
local compose = require("ember.run.compose")
local models = require("helpers.models")
local H = require("helpers.artifacts")

local function factory(file)
  return dofile("scripts/experiments/" .. file)
end

-- An observer that keeps a copy of every tensor it sees, keyed "stage|layer|phase|start".
local function recorder(name)
  local exp = { name = name or "recorder", seen = {}, order = {} }
  local stages = { "before_layer", "after_attention", "after_mlp", "after_layer", "before_logits", "after_logits" }
  for _, stage in ipairs(stages) do
    exp[stage] = function(self, ctx, view)
      local key = string.format("%s|%s|%s|%d", stage, tostring(ctx.layer_index), ctx.phase, ctx.start_position)
      self.seen[key] = { bytes = view:bytes(), shape = view:shape(), fingerprint = view:fingerprint() }
      self.order[#self.order + 1] = key
    end
  end
  return exp
end

local fnv1a64 = require("helpers.fnv").fnv1a64

local model
-- N generated tokens cost one prefill and N decode evaluations (SPEC §4.1): 1 + #out.ids in all.
local GEN = { prompt = models.PROMPT, max_tokens = 4, temperature = 0 }
local function gen(exp) return models.generate(model, GEN, exp) end

local need_default = models.lazy_default()
local function need_model()
  model = need_default()
  return model ~= nil
end

describe("activation_stats.lua", function()
  after_each(H.cleanup)

  it("leaves logits and generated ids bit-identical to a run without it", function()
    if not need_model() then return end
    local plain = gen(nil)
    local with_stats = gen(factory("activation_stats.lua")({}))
    assert.same(plain.ids, with_stats.ids)
    assert.equal(plain.logits:sha256(), with_stats.logits:sha256())
    assert.is_false(with_stats.modified)
    -- and every evaluation's logits, seen by the same observer with and without statistics
    local r1, r2 = recorder(), recorder()
    gen(r1)
    gen(compose.compose({ factory("activation_stats.lua")({}), r2 }))
    assert.same(r1.order, r2.order)
    for _, k in ipairs(r1.order) do assert.equal(r1.seen[k].bytes, r2.seen[k].bytes, k) end
  end)

  it("writes one record per hook call with stable keys, u64 fingerprints and token ranges", function()
    if not need_model() then return end
    local path = H.tmpdir() .. "/stats.json"
    local rec = recorder()
    local out = gen(compose.compose({ factory("activation_stats.lua")({ output = path }), rec }))
    local text = H.read(path)
    local doc = cjson.decode(text)
    assert.equal("activation-stats", doc.experiment)
    assert.is_true(doc.observation_only)
    local L = model.info.n_layers
    local evaluations = 1 + #out.ids -- prefill + one decode per generated token
    assert.equal(evaluations * (4 * L + 2), #doc.records)
    assert.equal(#rec.order, #doc.records)
    -- top-level and record keys appear in the documented order in the text itself
    local p1, p2, p3 = text:find('"experiment"'), text:find('"observation_only"'), text:find('"records"')
    assert.is_true(p1 < p2 and p2 < p3)
    local first = text:match("%b{}", text:find('"records"'))
    local last_pos = 0
    for _, key in ipairs({ "phase", "stage", "layer_index", "sequence_length", "start_position", "token_range",
      "shape", "dtype", "l2_norm", "abs_max", "fingerprint" }) do
      local p = first:find('"' .. key .. '"', 1, true)
      assert.is_truthy(p, key)
      assert.is_true(p > last_pos, key .. " out of order")
      last_pos = p
    end
    -- fingerprints are the full unsigned 64-bit FNV-1a of the tensor bytes, as digits in the text
    local digits = {}
    for d in text:gmatch('"fingerprint": (%d+)') do digits[#digits + 1] = d end
    assert.equal(#doc.records, #digits)
    local P = #out.prompt_ids
    for i, r in ipairs(doc.records) do
      local key = rec.order[i]
      local seen = rec.seen[key]
      local stage, layer, phase, start = key:match("^([^|]+)|([^|]+)|([^|]+)|(%d+)$")
      assert.equal(stage, r.stage)
      assert.equal(phase, r.phase)
      assert.equal(tonumber(start), r.start_position)
      if layer == "nil" or layer == "-1" then
        assert.equal(cjson.null, r.layer_index)
      else
        assert.equal(tonumber(layer), r.layer_index)
      end
      assert.equal(string.format("%u", fnv1a64(seen.bytes)), digits[i])
      local rows = seen.shape[1]
      assert.same({ rows, seen.shape[2] }, r.shape)
      assert.same({ r.sequence_length - rows, r.sequence_length }, r.token_range)
      if r.phase == "prefill" then assert.equal(P, r.sequence_length) end
      -- the norm agrees with one computed here from the raw values
      local sum = 0
      for _, v in ipairs(H.unpack_f32(seen.bytes)) do sum = sum + v * v end
      assert.near(math.sqrt(sum), r.l2_norm, 1e-6 * math.max(1, math.sqrt(sum)))
    end
  end)
end)

describe("zero_layer_output.lua", function()
  it("zeroes only the target in prefill and every decode, counts it, and says so", function()
    if not need_model() then return end
    local notices = {}
    local zero = factory("zero_layer_output.lua")({ target = "1:mlp",
      notice = function(m) notices[#notices + 1] = m end })
    local rec = recorder()
    local base = recorder()
    gen(base)
    local out = gen(compose.compose({ zero, rec }))
    assert.is_true(out.modified)
    local evaluations = 1 + #out.ids -- prefill + one decode per generated token
    assert.equal(evaluations, zero.stats.interventions)
    assert.equal(1, zero.stats.prefill)
    assert.equal(#out.ids, zero.stats.decode)
    local zeroed = 0
    for key, t in pairs(rec.seen) do
      if key:match("^after_mlp|1|") then
        for _, v in ipairs(H.unpack_f32(t.bytes)) do assert.equal(0, v) end
        zeroed = zeroed + 1
      end
    end
    assert.equal(evaluations, zeroed)
    -- everything computed before the target is untouched
    assert.equal(base.seen["after_mlp|0|prefill|0"].bytes, rec.seen["after_mlp|0|prefill|0"].bytes)
    assert.equal(base.seen["after_attention|1|prefill|0"].bytes, rec.seen["after_attention|1|prefill|0"].bytes)
    assert.not_equal(base.seen["after_layer|1|prefill|0"].bytes, rec.seen["after_layer|1|prefill|0"].bytes)
    assert.equal(1, #notices)
    assert.matches("MODIFIED", notices[1], 1, true)
    assert.matches(string.format("in %d evaluations (prefill 1, decode %d)", evaluations, #out.ids), notices[1], 1,
      true)
  end)

  it("refuses an unknown stage when made, and a layer the model lacks before any tensor hook", function()
    local ok, err = pcall(factory("zero_layer_output.lua"), "1:mlpx")
    assert.is_false(ok)
    assert.matches("unknown stage 'mlpx'", err, 1, true)
    -- --experiment-args "layer=1" alone: the message shows the two forms that work
    ok, err = pcall(factory("zero_layer_output.lua"), require("ember.run.builtin").args("layer=1"))
    assert.is_false(ok)
    assert.matches("layer= needs stage= beside it (attention|mlp|layer): --experiment-args 'layer=1 stage=mlp' or "
      .. "'1:mlp'", err, 1, true)
    if not need_model() then return end
    local zero = factory("zero_layer_output.lua")({ target = model.info.n_layers .. ":attention",
      notice = function() end })
    local rec = recorder()
    ok, err = pcall(gen, compose.compose({ zero, rec }))
    assert.is_false(ok)
    assert.matches("failed in on_model_loaded", tostring(err), 1, true)
    assert.matches("out of range", tostring(err), 1, true)
    assert.equal(0, #rec.order)
  end)
end)

describe("example interventions", function()
  it("scale_attention.lua: factor 1 is bit-identical; factor 0.5 halves exactly the target", function()
    if not need_model() then return end
    local plain = gen(nil)
    local same = gen(factory("scale_attention.lua")("layer=1 factor=1"))
    assert.equal(plain.logits:sha256(), same.logits:sha256())
    assert.same(plain.ids, same.ids)
    local base, rec = recorder(), recorder()
    gen(base)
    local exp = factory("scale_attention.lua")("layer=1 factor=0.5")
    gen(compose.compose({ exp, rec }))
    assert.equal(1 + #plain.ids, exp.stats.scaled) -- prefill + every decode
    local b = H.unpack_f32(base.seen["after_attention|1|prefill|0"].bytes)
    local s = H.unpack_f32(rec.seen["after_attention|1|prefill|0"].bytes)
    for i = 1, #b do assert.equal(b[i] * 0.5, s[i]) end -- halving is exact in binary floating point
  end)

  it("steering_vector.lua: adds scale on one hidden dimension after the layer, nothing elsewhere", function()
    if not need_model() then return end
    local base, rec = recorder(), recorder()
    gen(base)
    local exp = factory("steering_vector.lua")("layer=2 scale=4 dim=5")
    local out = gen(compose.compose({ exp, rec }))
    assert.is_true(out.modified)
    assert.equal(1 + #out.ids, exp.stats.additions) -- prefill + every decode
    local H_ = model.info.hidden_size
    local b = H.unpack_f32(base.seen["after_layer|2|prefill|0"].bytes)
    local s = H.unpack_f32(rec.seen["after_layer|2|prefill|0"].bytes)
    for i = 1, #b do
      local col = (i - 1) % H_
      if col == 5 then
        assert.near(4, s[i] - b[i], 1e-5)
      else
        assert.equal(b[i], s[i])
      end
    end
  end)

  it("steering_vector.lua: a vector file gives the same run as the equivalent dim= direction", function()
    if not need_model() then return end
    local hidden = model.info.hidden_size
    local v = {}
    for i = 1, hidden do v[i] = (i == 6) and 1.0 or 0.0 end
    local path = H.tmpdir() .. "/dir.f32"
    H.write(path, H.f32(v))
    local by_dim = gen(factory("steering_vector.lua")("layer=2 scale=4 dim=5"))
    local by_file = gen(factory("steering_vector.lua")("layer=2 scale=4 vector=" .. path))
    assert.equal(by_dim.logits:sha256(), by_file.logits:sha256())
    assert.same(by_dim.ids, by_file.ids)
    H.write(path, H.f32({ 1, 2, 3 }))
    local ok, err = pcall(gen, factory("steering_vector.lua")("layer=2 scale=4 vector=" .. path))
    assert.is_false(ok)
    assert.matches("holds 12 bytes, expected " .. (hidden * 4), tostring(err), 1, true)
    -- longer than a vector, or endless: refused by the bounded reader, naming the file
    v[#v + 1] = 0.0
    H.write(path, H.f32(v))
    ok, err = pcall(gen, factory("steering_vector.lua")("layer=2 scale=4 vector=" .. path))
    assert.is_false(ok)
    assert.matches(path .. ": file is " .. (hidden * 4 + 4) .. " bytes, more than the limit of " .. (hidden * 4),
      tostring(err), 1, true)
    os.remove(path)
    assert(os.execute("ln -s /dev/zero " .. require("ember.store.fs").shell_quote(path)))
    ok, err = pcall(gen, factory("steering_vector.lua")("layer=2 scale=4 vector=" .. path))
    assert.is_false(ok)
    assert.matches("is a character device", tostring(err), 1, true)
    H.cleanup()
  end)

  it("refuse bad arguments with their names", function()
    local ok, err = pcall(factory("steering_vector.lua"), "layer=2 scale=4")
    assert.is_false(ok)
    assert.matches("exactly one of dim=K", err, 1, true)
    ok, err = pcall(factory("scale_attention.lua"), "layer=x factor=2")
    assert.is_false(ok)
    assert.matches("layer", err, 1, true)
  end)
end)

-- the tiny models made for this file
teardown(function() require("helpers.fixtures").cleanup() end)
