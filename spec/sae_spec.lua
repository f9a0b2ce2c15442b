-- ember.sae: synthetic SAEs in every layout and architecture, written by an independent writer
-- (spec/reference/sae_reference.py: json + struct + numpy), read by ember.sae.load and encoded and
-- decoded in C, against the same script's float64 encode and decode of the weights as stored:
-- features and reconstruction within 1e-5 of each row's largest value on the reference path and
-- on the default kernels, the same active features, identical bits for any thread count; the same
-- on a model's own activations (reference kernels), which the spliced sae_features also sees; and the
-- errors that name the field (unknown architecture or normalisation, contradicting metadata, a
-- missing or stray tensor, no hook).

local ember = require("ember")
local sae_mod = require("ember.sae")
local H = require("helpers.artifacts")
local files = require("helpers.files")
local cases = require("helpers.sae_cases")
local npy = require("helpers.npy")

local missing = cases.missing
local reference_case = cases.copy

-- The largest |got - want| of each row over that row's largest |want|, the worst row.
local function worst_rel(t, want, rows, cols)
  local worst = 0
  for r = 1, rows do
    local m = 0
    for c = 1, cols do m = math.max(m, math.abs(want[(r - 1) * cols + c])) end
    for c = 1, cols do
      local d = math.abs(t:get(r, c) - want[(r - 1) * cols + c]) / m
      if d > worst or d ~= d then worst = d end
    end
  end
  return worst
end

-- The 0-based indices of the nonzero features of each row.
local function active(f)
  local rows, cols = table.unpack(f:shape())
  local out = {}
  for r = 1, rows do
    local a = {}
    for c = 1, cols do if f:get(r, c) ~= 0 then a[#a + 1] = c - 1 end end
    out[r] = a
  end
  return out
end

local CASES = {
  { "saelens_standard_pre6", format = "saelens", architecture = "standard", hook = "blocks.1.hook_resid_post" },
  { "saelens_standard_v6", format = "saelens", architecture = "standard", apply_b_dec_to_input = false },
  { "saelens_jumprelu_v6", format = "saelens", architecture = "jumprelu" },
  { "saelens_jumprelu_log_bf16", format = "saelens", architecture = "jumprelu", dtype = "bf16" },
  { "saelens_topk_f16", format = "saelens", architecture = "topk", dtype = "f16", k = 16 },
  { "saelens_topk_pre6", format = "saelens", architecture = "topk", k = 8 },
  { "saelens_gated", format = "saelens", architecture = "gated" },
  { "saelens_constant_norm", format = "saelens", normalize_activations = "constant_norm_rescale" },
  { "saelens_layer_norm", format = "saelens", normalize_activations = "layer_norm" },
  { "saelens_expected_average", format = "saelens", normalize_activations = "expected_average_only_in" },
  { "saelens_scaling_factor", format = "saelens", architecture = "standard" },
  { "saelens_transcoder", format = "saelens", transcoder = true, d_out = 48, hook_out = "blocks.1.hook_mlp_out" },
  { "saelens_hook_z", format = "saelens", reshape_activations = "hook_z", hook = "blocks.1.attn.hook_z" },
  { "saelens_hook_z_head", format = "saelens", hook = "blocks.1.attn.hook_z", hook_head_index = 2, d_in = 16 },
  { "gemma_scope", format = "gemma_scope", architecture = "jumprelu", load = { hook = "blocks.1.hook_resid_post" } },
  { "gemma_scope_compressed", format = "gemma_scope", load = { hook = "blocks.1.hook_resid_post" }, zlib = true },
  { "llama_scope", format = "llama_scope", architecture = "jumprelu", dtype = "bf16",
    normalize_activations = "expected_average_only_in" },
}

describe("ember.sae.load + encode/decode against a float64 reference", function()
  if missing then return pending(missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  for _, c in ipairs(CASES) do
    it(c[1], function()
      if c.zlib and npy.zlib_missing then return pending("params.npz is deflated and " .. npy.zlib_missing) end
      local e = reference_case(c[1])
      for _, kernels in ipairs({ "reference", "auto" }) do
        local opts = { kernels = kernels, threads = 2 }
        for k, v in pairs(c.load or {}) do opts[k] = v end
        local sae = sae_mod.load(e.sae, opts)
        for k, v in pairs(c) do
          if type(k) == "string" and k ~= "load" and k ~= "zlib" then assert.are.equal(v, sae[k], k) end
        end
        assert.are.equal(e.d_in, sae.d_in)
        assert.are.equal(e.d_sae, sae.d_sae)
        local f = sae:encode(e.x)
        assert.are.same({ e.rows, e.d_sae }, f:shape())
        assert.is_true(worst_rel(f, e.f, e.rows, e.d_sae) <= 1e-5, kernels .. ": features")
        assert.are.same(e.active, active(f))
        local out = sae:decode(f, e.x)
        assert.are.same({ e.rows, e.d_out }, out:shape())
        assert.is_true(worst_rel(out, e.out, e.rows, e.d_out) <= 1e-5, kernels .. ": reconstruction")
        if e.log_sparsity then -- sparsity.safetensors, as stored (f32)
          assert.are.same({ 1, e.d_sae }, sae.log_sparsity:shape())
          local got = sae.log_sparsity:values()
          for j = 1, e.d_sae do assert.are.equal(string.pack("<f", e.log_sparsity[j]), string.pack("<f", got[j])) end
        end
        sae:close()
      end
    end)
  end

  it("reads sparsity.safetensors when it is there", function()
    assert.is_not_nil(reference_case("saelens_standard_pre6").log_sparsity)
    assert.is_nil(sae_mod.load(reference_case("saelens_standard_v6").sae).log_sparsity)
  end)

  it("takes the hook option over the file's hook (SAELens, Llama Scope)", function()
    local e = reference_case("saelens_standard_v6")
    local sae = sae_mod.load(e.sae, { hook = "blocks.3.hook_mlp_out" })
    assert.are.equal("blocks.3.hook_mlp_out", sae.hook)
    assert.are.equal(3, sae.hook_layer)
    local l = reference_case("llama_scope")
    assert.are.equal("blocks.2.hook_attn_out", sae_mod.load(l.sae, { hook = "blocks.2.hook_attn_out" }).hook)
  end)

  it("gives the same bits for 1 and 3 threads (encode, decode)", function()
    local e = reference_case("saelens_topk_f16")
    local a = sae_mod.load(e.sae, { threads = 1 })
    local b = sae_mod.load(e.sae, { threads = 3 })
    local fa, fb = a:encode(e.x), b:encode(e.x)
    assert.are.equal(fa:sha256(), fb:sha256())
    assert.are.equal(a:decode(fa):sha256(), b:decode(fb):sha256())
  end)

  it("gives a feature's decoder row as its direction (W_dec row, scaling applied)", function()
    local e = reference_case("saelens_standard_v6")
    local sae = sae_mod.load(e.sae, { kernels = "reference", threads = 1 })
    -- decode(one-hot f) - decode(0) = W_dec[i] (the reconstruction is affine in f)
    local i = 37
    local onehot = ember.tensor(1, e.d_sae)
    onehot:set(1, i + 1, 1.0)
    local diff = sae:decode(onehot):values()
    local base = sae:decode(ember.tensor(1, e.d_sae)):values()
    local dir = sae:direction(i):values()
    for j = 1, e.d_in do assert.is_true(math.abs(diff[j] - base[j] - dir[j]) <= 1e-6) end
    assert.has_error(function() sae:direction(e.d_sae) end)
  end)
end)

describe("ember.sae on a model's own activations (the reference path)", function()
  if missing then return pending(missing) end
  after_each(H.cleanup)

  it("encodes after_layer 1 of the tiny llama as float64 does, and the splice sees those features", function()
    local path = require("helpers.models").default_model()
    if not path then return pending("the default tiny model is not available") end
    local model = ember.load { model = path, kernels = "reference", threads = 2 }
    local ids = model:tokenize("The quick brown fox jumps")
    local x = model:run_with_cache { ids = ids, stages = { "after_layer" }, layers = { 1 } }.after_layer[1]
    for _, name in ipairs({ "saelens_jumprelu_v6", "saelens_topk_f16", "saelens_layer_norm" }) do
      local e = cases.on_inputs(name, x)
      assert.are.equal(x:sha256(), e.x:sha256()) -- the script read exactly these activations
      local sae = sae_mod.load(e.sae, { model = model })
      local f = sae:encode(x)
      assert.is_true(worst_rel(f, e.f, e.rows, e.d_sae) <= 1e-5, name .. ": features")
      assert.are.same(e.active, active(f), name)
      assert.is_true(worst_rel(sae:decode(f, x), e.out, e.rows, e.d_out) <= 1e-5, name .. ": reconstruction")
      local seen
      local exp = { name = "seen" }
      function exp:sae_features(ctx, v) if ctx.phase == "prefill" then seen = v:clone() end end
      model:generate { ids = ids, max_tokens = 0, sae = sae, experiment = exp }
      assert.are.equal(f:sha256(), seen:sha256(), name .. ": the spliced features")
      sae:close()
    end
    model:close()
  end)
end)

local edit_cfg = cases.edit_cfg

local function load_error(path, opts)
  local ok, err = pcall(sae_mod.load, path, opts)
  assert.is_false(ok, "loaded")
  return tostring(err)
end

describe("ember.sae.load refusals", function()
  if missing then return pending(missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("names an unknown architecture, normalisation, reshape and activation", function()
    local e = reference_case("saelens_standard_v6")
    edit_cfg(e, function(c) c.architecture = "matryoshka" end)
    assert.matches("architecture 'matryoshka' is not one of standard, jumprelu", load_error(e.sae))
    edit_cfg(e, function(c) c.architecture = "standard"; c.normalize_activations = "batch_norm" end)
    assert.matches("normalize_activations 'batch_norm' is not one of none", load_error(e.sae))
    edit_cfg(e, function(c) c.normalize_activations = "expected_average_only_in" end)
    assert.matches("expected_average_only_in needs the norm scaling factor", load_error(e.sae))
    edit_cfg(e, function(c) c.normalize_activations = nil; c.reshape_activations = "hook_q" end)
    assert.matches("reshape_activations 'hook_q'", load_error(e.sae))
    edit_cfg(e, function(c) c.reshape_activations = "hook_z" end)
    assert.matches("hook_name 'blocks.1.hook_resid_post' is not a hook_z", load_error(e.sae))
    edit_cfg(e, function(c) c.reshape_activations = nil; c.activation_fn = "tanh-relu" end)
    assert.matches("activation_fn 'tanh%-relu' is not read", load_error(e.sae))
  end)

  it("names a contradiction between the top level and metadata, and between hook_layer and hook_name", function()
    local e = reference_case("saelens_standard_v6")
    edit_cfg(e, function(c) c.hook_name = "blocks.2.hook_resid_post" end)
    assert.matches("hook_name is \"blocks.2.hook_resid_post\" at the top level but \"blocks.1.hook_resid_post\" "
      .. "under metadata", load_error(e.sae), nil, true)
    edit_cfg(e, function(c) c.hook_name = nil; c.metadata.hook_layer = 3 end)
    assert.matches("hook_layer 3 contradicts hook_name 'blocks.1.hook_resid_post' (layer 1)", load_error(e.sae),
      nil, true)
  end)

  it("names a hook or model field that is not a string (or a layer that is not a number)", function()
    local e = reference_case("saelens_standard_v6")
    edit_cfg(e, function(c) c.metadata.hook_name = 7 end)
    assert.matches("cfg.json: hook_name must be a string, not 7", load_error(e.sae), nil, true)
    edit_cfg(e, function(c) c.metadata.hook_name = "blocks.1.hook_resid_post"; c.metadata.hook_layer = { 1 } end)
    assert.matches("cfg.json: hook_layer must be a number, not an array or object", load_error(e.sae), nil, true)
    local l = reference_case("llama_scope")
    local path = l.sae .. "/hyperparams.json"
    local cjson = require("cjson")
    local original = files.read(path)
    for _, field in ipairs({ "hook_point_in", "hook_point_out", "model_name" }) do
      local edited = cjson.decode(original)
      edited[field] = field == "model_name" and { "m" } or true
      H.write(path, cjson.encode(edited))
      assert.matches("hyperparams.json: " .. field .. " must be a string", load_error(l.sae), nil, true)
    end
    H.write(path, original)
  end)

  it("names d_in, d_sae, k and dtype when they are wrong", function()
    local e = reference_case("saelens_topk_f16")
    edit_cfg(e, function(c) c.d_in = 65 end)
    assert.matches("tensor 'W_enc' has shape [64, 256], but cfg.json's d_in/d_sae gives [65, 256]",
      load_error(e.sae), nil, true)
    edit_cfg(e, function(c) c.d_in = "64" end)
    assert.matches("d_in must be a positive integer (got 64)", load_error(e.sae), nil, true)
    edit_cfg(e, function(c) c.d_in = 64; c.k = 300 end)
    assert.matches("k = 300 is more than d_sae = 256", load_error(e.sae), nil, true)
    edit_cfg(e, function(c) c.k = 16; c.dtype = "float64" end)
    assert.matches("dtype 'float64' is not read", load_error(e.sae), nil, true)
    -- a Llama Scope top-k SAE's top_k (fuzz_formats found it reaching the engine unchecked)
    local l = reference_case("llama_scope")
    local path = l.sae .. "/hyperparams.json"
    local cjson = require("cjson")
    local original = files.read(path)
    local edited = cjson.decode(original)
    edited.act_fn, edited.top_k = "topk", 2147483647
    H.write(path, cjson.encode(edited))
    local err = load_error(l.sae)
    assert.matches("hyperparams.json: top_k = 2147483647 is more than d_sae = ", err, nil, true)
    assert.is_nil(err:find("%.lua:%d+:"), err) -- the file named, no source location
    H.write(path, original)
  end)

  it("names a missing and a stray tensor", function()
    local e = reference_case("saelens_standard_v6")
    edit_cfg(e, function(c) c.architecture = "jumprelu" end)
    assert.matches("has neither 'threshold' nor 'log_threshold'", load_error(e.sae))
    local j = reference_case("saelens_jumprelu_v6")
    edit_cfg(j, function(c) c.architecture = "standard" end)
    assert.matches("holds tensor 'threshold', which architecture standard does not use", load_error(j.sae))
  end)

  it("asks for a hook when the file names none (Gemma Scope) and checks a layer_N folder", function()
    local e = reference_case("gemma_scope")
    assert.matches("the file names no hook; give one", load_error(e.sae))
    local dir = e.dir .. "/layer_3"
    assert(os.execute("mkdir " .. H.shell_quote(dir) .. " && cp " .. H.shell_quote(e.sae .. "/params.npz") .. " "
      .. H.shell_quote(dir)))
    assert.matches("hook 'blocks.1.hook_resid_post' is layer 1, but the file sits in a layer_3 folder",
      load_error(dir .. "/params.npz", { hook = "blocks.1.hook_resid_post" }), nil, true)
    assert.are.equal(3, sae_mod.load(dir, { hook = "blocks.3.hook_mlp_out" }).hook_layer)
  end)

  it("refuses damaged files with an error naming them, never a crash", function()
    local e = reference_case("saelens_standard_v6")
    local w = e.sae .. "/sae_weights.safetensors"
    local bytes = files.read(w)
    H.write(w, bytes:sub(1, #bytes - 100))
    assert.matches("sae_weights.safetensors", load_error(e.sae))
    H.write(w, "\255\255\255\255\255\255\255\127{}")
    assert.matches("header length .* does not fit", load_error(e.sae))
    H.write(e.sae .. "/cfg.json", "{ not json")
    assert.matches("cfg.json", load_error(e.sae))
    local g = reference_case("gemma_scope")
    local z = files.read(g.sae .. "/params.npz")
    H.write(g.sae .. "/params.npz", z:sub(1, 1000) .. z:sub(-22))
    assert.matches("params.npz", load_error(g.sae, { hook = "blocks.1.hook_resid_post" }))
    H.write(g.sae .. "/params.npz", "PK\3\4 not a zip")
    assert.matches("not a ZIP archive", load_error(g.sae, { hook = "blocks.1.hook_resid_post" }))
  end)

  it("refuses unknown options and a path that holds no SAE", function()
    local e = reference_case("saelens_standard_v6")
    assert.matches("unknown option 'hok'", load_error(e.sae, { hok = "x" }))
    assert.matches("holds none of cfg.json", load_error(e.dir .. "/sae/..", nil))
    assert.matches("does not exist", load_error(e.dir .. "/nothing.bin"))
  end)
end)
