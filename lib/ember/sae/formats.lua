-- ember.sae.formats — the three file layouts of sparse autoencoders and transcoders, read into one
-- description (the fields below) that ember.sae builds an engine SAE from. Knows the files, not
-- the maths (src/engine/sae.c) nor where an SAE sits in a model (ember.sae checks that).
--
--   SAELens      DIR/cfg.json + DIR/sae_weights.safetensors (+ optional DIR/sparsity.safetensors)
--   Gemma Scope  DIR/params.npz or the .npz itself (W_enc, W_dec, b_enc, b_dec, threshold; JumpReLU)
--   Llama Scope  DIR/hyperparams.json + DIR/checkpoints/final.safetensors (encoder/decoder Linear
--                weights, a scalar jump_relu_threshold, dataset-wise normalisation)
--
-- A description: { format, files = {..}, architecture = standard|jumprelu|topk|gated, transcoder,
--   d_in, d_sae, d_out, dtype = f32|f16|bf16, k, apply_b_dec_to_input, normalize_activations,
--   scale_in, scale_out, reshape_activations, hook, hook_layer, hook_head_index, hook_out,
--   hook_layer_out, model_name, cfg, tensors = { name = { data, offset, dtype, shape } },
--   enc_by_feature, dec_by_output, threshold_all, sparsity = { data, offset, dtype, shape } | nil }

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local safetensors = require("ember.store.safetensors")
local shapes = require("ember.store.shape")
local f16_value = require("ember.store.vector_file").f16_value

local M = {}

-- Bounds of what is read: a config is small; weights are whatever the SAE needs, but a bound
-- keeps a wrong path from reading without end.
M.MAX_CONFIG_BYTES = 16 * 1024 * 1024
M.MAX_WEIGHTS_BYTES = 64 * 1024 * 1024 * 1024

M.ARCHITECTURES = { "standard", "jumprelu", "topk", "gated", "transcoder", "jumprelu_transcoder" }
M.NORMALIZATIONS = { "none", "expected_average_only_in", "constant_norm_rescale", "layer_norm" }

local function fail(what, msg, ...) error(string.format("%s: " .. msg, what, ...), 0) end

local function read(path, max) return fs.read(path, "sae", max) end

local function read_json(path)
  local v = json.decode(read(path, M.MAX_CONFIG_BYTES), path)
  if type(v) ~= "table" then fail(path, "is not a JSON object") end
  return v
end

-- JSON null reads as nil.
local function val(x) if x == json.null then return nil end return x end

local function list(t) return table.concat(t, ", ") end

local function one_of(v, names)
  for _, n in ipairs(names) do if v == n then return true end end
  return false
end

local function positive_int(v, what, field)
  v = val(v)
  if math.type(v) == "float" and v == math.floor(v) then v = math.tointeger(v) end
  if math.type(v) ~= "integer" or v < 1 then
    fail(what, "%s must be a positive integer (got %s)", field, v == nil and "nothing" or tostring(v))
  end
  return v
end

-- A top-k SAE's k: a positive integer no larger than its d_sae features (every format's rule).
local function top_k(v, d_sae, what, field)
  local k = positive_int(v, what, field)
  if k > d_sae then fail(what, "%s = %d is more than d_sae = %d", field, k, d_sae) end
  return k
end

-- "float32", "torch.float32", "f32", ... -> "f32" | "f16" | "bf16"
local DTYPES = { float32 = "f32", f32 = "f32", float = "f32", float16 = "f16", f16 = "f16", half = "f16",
  bfloat16 = "bf16", bf16 = "bf16" }
local function dtype_of(v, what, field)
  v = val(v)
  if v == nil then return "f32" end
  local d = type(v) == "string" and DTYPES[v:gsub("^torch%.", ""):lower()]
  if not d then fail(what, "%s '%s' is not read (float32, float16 or bfloat16)", field, tostring(v)) end
  return d
end

-- A tensor of a safetensors file as the engine's spec takes it: rank 1 or 2 after folding (W_enc's
-- leading dimensions and W_dec's trailing ones, as hook_z SAEs store [n_heads, d_head, d_sae]).
local function spec_tensor(content, e, name, what, fold_leading)
  if e.dtype ~= "F32" and e.dtype ~= "F16" and e.dtype ~= "BF16" then
    fail(what, "tensor '%s' is %s (F32, F16 or BF16 are read)", name, e.dtype)
  end
  local s = e.shape
  local shape
  if #s <= 2 then
    shape = { table.unpack(s) }
  elseif fold_leading then
    shape = { shapes.check({ table.unpack(s, 1, #s - 1) }, nil, what .. ": tensor '" .. name .. "'"), s[#s] }
  else
    shape = { s[1], shapes.check({ table.unpack(s, 2) }, nil, what .. ": tensor '" .. name .. "'") }
  end
  if #shape == 0 then shape = { 1 } end
  return { data = content, offset = e.offset, dtype = e.dtype, shape = shape }
end

local function open_safetensors(path)
  local content = read(path, M.MAX_WEIGHTS_BYTES)
  return content, safetensors.decode(content, path, { copy = false })
end

-- The tensor's shape as "[a, b]" for messages.
local function shape_s(t) return "[" .. table.concat(t.shape, ", ") .. "]" end

local function check_shape(t, rows, cols, name, what, cfgwhat)
  local r, c = t.shape[1], t.shape[2]
  if #t.shape == 1 then r, c = 1, t.shape[1] end
  if r ~= rows or c ~= cols then
    fail(what, "tensor '%s' has shape %s, but %s gives [%d, %d]", name, shape_s(t), cfgwhat, rows, cols)
  end
end

local function check_vector(t, n, name, what, cfgwhat)
  if #t.shape ~= 1 and not (#t.shape == 2 and t.shape[1] == 1) then
    fail(what, "tensor '%s' has shape %s, expected a vector of %d", name, shape_s(t), n)
  end
  if t.shape[#t.shape] ~= n then
    fail(what, "tensor '%s' has %d values, but %s gives %d", name, t.shape[#t.shape], cfgwhat, n)
  end
end

-- An F32 tensor made here (exp of log_threshold, a scalar threshold), in spec form.
local function f32_spec(values)
  local parts = {}
  for i, v in ipairs(values) do parts[i] = string.pack("<f", v) end
  return { data = table.concat(parts), offset = 0, dtype = "F32", shape = { #values } }
end

-- Values of a rank-1 spec tensor as numbers (small vectors only).
local function values_of(t)
  local out, n = {}, t.shape[#t.shape]
  local base = t.offset + 1
  for i = 0, n - 1 do
    if t.dtype == "F32" then
      out[i + 1] = string.unpack("<f", t.data, base + 4 * i)
    else
      local h = string.unpack("<I2", t.data, base + 2 * i)
      out[i + 1] = t.dtype == "BF16" and string.unpack("<f", string.pack("<I4", h << 16)) or f16_value(h)
    end
  end
  return out
end
M.values_of = values_of

-- The layer of a TransformerLens hook name ("blocks.12.hook_resid_post" -> 12), or nil.
local function layer_of(hook) return hook and math.tointeger(tonumber(hook:match("^blocks%.(%d+)%."))) end
M.layer_of = layer_of

-- ---- SAELens ---------------------------------------------------------------------------------

-- v itself when it is nil or of Lua type `kind` ("string", "number"); else an error naming the field
-- (a hook name that is a number or a table would otherwise fail far from the file).
local function typed(v, kind, what, field)
  if v ~= nil and type(v) ~= kind then
    fail(what, "%s must be a %s, not %s", field, kind, type(v) == "table" and "an array or object" or json.encode(v))
  end
  return v
end

-- A field of Lua type `kind`, read at the top level (before v6) or under metadata (v6; "meta" in
-- some 6.x files), with its old name; present in both places with different values is an error
-- naming it.
local function cfg_field(cfg, meta, what, kind, key, old)
  local top = val(cfg[key])
  if top == nil and old then top = val(cfg[old]) end
  local m
  if meta then
    m = val(meta[key])
    if m == nil and old then m = val(meta[old]) end
  end
  if top ~= nil and m ~= nil and top ~= m then
    fail(what, "%s is %s at the top level but %s under metadata: the file contradicts itself", key,
      json.encode(top), json.encode(m))
  end
  if top ~= nil then return typed(top, kind, what, key) end
  return typed(m, kind, what, key)
end

local function saelens_normalization(cfg, what, opts)
  local n = val(cfg.normalize_activations)
  if n == true then n = "expected_average_only_in" elseif n == false or n == nil then n = "none" end
  if type(n) ~= "string" or not one_of(n, M.NORMALIZATIONS) then
    fail(what, "normalize_activations '%s' is not one of %s", tostring(n), list(M.NORMALIZATIONS))
  end
  local scale
  if n == "expected_average_only_in" then
    scale = opts.norm_scaling_factor or val(cfg.norm_scaling_factor)
    if type(scale) ~= "number" or not (scale > 0) then
      fail(what, "normalize_activations = expected_average_only_in needs the norm scaling factor (cfg's "
        .. "norm_scaling_factor, or ember.sae.load(path, { norm_scaling_factor = x }))")
    end
  end
  return n, scale
end

-- architecture + activation function -> the engine's activation, transcoder flag and k.
local function saelens_architecture(cfg, what, d_sae)
  local arch = val(cfg.architecture) or "standard"
  if type(arch) ~= "string" or not one_of(arch, M.ARCHITECTURES) then
    fail(what, "architecture '%s' is not one of %s", tostring(arch), list(M.ARCHITECTURES))
  end
  local transcoder = arch == "transcoder" or arch == "jumprelu_transcoder"
  local act = arch == "jumprelu_transcoder" and "jumprelu" or arch == "transcoder" and "standard" or arch
  local fn = val(cfg.activation_fn) or val(cfg.activation_fn_str) or "relu"
  local k
  if fn == "topk" and act == "standard" then act = "topk" end
  if act == "topk" then
    local kwargs = val(cfg.activation_fn_kwargs)
    k = val(cfg.k) or (type(kwargs) == "table" and val(kwargs.k)) or nil
    k = top_k(k, d_sae, what, "k")
  elseif fn ~= "relu" then
    fail(what, "activation_fn '%s' is not read (relu, or topk with activation_fn_kwargs.k)", tostring(fn))
  end
  return act, transcoder, k
end

-- The weights of a SAELens file checked against the cfg: the tensors the architecture uses, each
-- with its shape, and nothing else.
local function saelens_tensors(d, content, st, what)
  local T, used = {}, {}
  local function take(name, optional, fold_leading)
    local e = st.tensors[name]
    if not e then
      if optional then return nil end
      fail(what, "has no tensor '%s' (architecture %s)", name, d.cfg_architecture)
    end
    used[name] = true
    return spec_tensor(content, e, name, what, fold_leading)
  end
  local cfgwhat = "cfg.json's d_in/d_sae"
  T.W_enc = take("W_enc", false, true)
  check_shape(T.W_enc, d.d_in, d.d_sae, "W_enc", what, cfgwhat)
  T.W_dec = take("W_dec", false, false)
  check_shape(T.W_dec, d.d_sae, d.d_out, "W_dec", what, d.transcoder and "cfg.json's d_sae/d_out" or cfgwhat)
  T.b_dec = take("b_dec")
  check_vector(T.b_dec, d.d_out, "b_dec", what, d.transcoder and "d_out" or "d_in")
  if d.architecture == "gated" then
    for _, n in ipairs({ "b_gate", "b_mag", "r_mag" }) do
      T[n] = take(n)
      check_vector(T[n], d.d_sae, n, what, "d_sae")
    end
  else
    T.b_enc = take("b_enc")
    check_vector(T.b_enc, d.d_sae, "b_enc", what, "d_sae")
  end
  if d.architecture == "jumprelu" then
    T.threshold = take("threshold", true)
    if not T.threshold then
      local lt = take("log_threshold", true)
      if not lt then fail(what, "has neither 'threshold' nor 'log_threshold' (architecture jumprelu)") end
      check_vector(lt, d.d_sae, "log_threshold", what, "d_sae")
      local v = values_of(lt)
      for i = 1, #v do v[i] = math.exp(v[i]) end
      T.threshold = f32_spec(v)
    end
    check_vector(T.threshold, d.d_sae, "threshold", what, "d_sae")
  end
  local sf = take("scaling_factor", true)
  if sf then
    check_vector(sf, d.d_sae, "scaling_factor", what, "d_sae")
    local ones = true
    for _, v in ipairs(values_of(sf)) do if v ~= 1 then ones = false break end end
    if not ones then
      if not val(d.cfg.finetuning_scaling_factor) then
        fail(what, "holds a scaling_factor that is not all ones, but cfg.json's finetuning_scaling_factor is false")
      end
      T.scaling_factor = sf
    end
  end
  for _, name in ipairs(st.names) do
    if not used[name] then
      fail(what, "holds tensor '%s', which architecture %s does not use", name, d.cfg_architecture)
    end
  end
  return T
end

function M.saelens(dir, opts)
  local cfg_path = fs.join(dir, "cfg.json")
  local cfg = read_json(cfg_path)
  local what = cfg_path
  local meta = val(cfg.metadata) or val(cfg.meta)
  if meta ~= nil and type(meta) ~= "table" then fail(what, "metadata is not an object") end
  local d = { format = "saelens", cfg = cfg, files = { cfg = cfg_path } }
  d.d_in = positive_int(cfg.d_in, what, "d_in")
  d.d_sae = positive_int(cfg.d_sae, what, "d_sae")
  d.cfg_architecture = val(cfg.architecture) or "standard"
  d.architecture, d.transcoder, d.k = saelens_architecture(cfg, what, d.d_sae)
  d.d_out = d.transcoder and positive_int(val(cfg.d_out) or d.d_in, what, "d_out") or d.d_in
  d.dtype = dtype_of(opts.dtype or cfg.dtype, what, "dtype")
  local ab = val(cfg.apply_b_dec_to_input)
  if ab ~= nil and type(ab) ~= "boolean" then fail(what, "apply_b_dec_to_input must be true or false") end
  d.apply_b_dec_to_input = not d.transcoder and ab ~= false -- SAELens: default true; transcoders never
  d.normalize_activations, d.scale_in = saelens_normalization(cfg, what, opts)
  d.scale_out = d.scale_in
  d.reshape_activations = val(cfg.reshape_activations) or "none"
  if d.reshape_activations ~= "none" and d.reshape_activations ~= "hook_z" then
    fail(what, "reshape_activations '%s' is not one of none, hook_z", tostring(d.reshape_activations))
  end
  d.hook = cfg_field(cfg, meta, what, "string", "hook_name", "hook_point")
  d.hook_layer = cfg_field(cfg, meta, what, "number", "hook_layer", "hook_point_layer")
  d.hook_head_index = cfg_field(cfg, meta, what, "number", "hook_head_index", "hook_point_head_index")
  d.model_name = cfg_field(cfg, meta, what, "string", "model_name")
  if d.transcoder then
    d.hook_out = cfg_field(cfg, meta, what, "string", "hook_name_out")
    d.hook_layer_out = cfg_field(cfg, meta, what, "number", "hook_layer_out")
  end
  if d.reshape_activations == "hook_z" and type(d.hook) == "string" and not d.hook:match("hook_z$") then
    fail(what, "reshape_activations = hook_z, but hook_name '%s' is not a hook_z", d.hook)
  end
  local wpath = fs.join(dir, "sae_weights.safetensors")
  local content, st = open_safetensors(wpath)
  d.files.weights = wpath
  d.tensors = saelens_tensors(d, content, st, wpath)
  local spath = fs.join(dir, "sparsity.safetensors")
  if fs.exists(spath) then
    local sc, sst = open_safetensors(spath)
    local e = sst.tensors.sparsity
    if not e then fail(spath, "has no tensor 'sparsity'") end
    d.sparsity = spec_tensor(sc, e, "sparsity", spath, true)
    check_vector(d.sparsity, d.d_sae, "sparsity", spath, "d_sae")
    d.files.sparsity = spath
  end
  return d
end

-- ---- Gemma Scope -----------------------------------------------------------------------------

local NPY_DTYPE = { ["<f4"] = "F32", ["<f2"] = "F16" }

function M.gemma_scope(path, opts)
  local what = path
  local z = read(path, M.MAX_WEIGHTS_BYTES)
  local npz = require("ember.store.npz").read(z, path)
  local T, used = {}, {}
  local function take(name, fold_leading)
    local a = npz.arrays[name] or npz.arrays[name:gsub("^W_", "w_")]
    if not a then fail(what, "has no array '%s' (Gemma Scope: W_enc, W_dec, b_enc, b_dec, threshold)", name) end
    used[npz.arrays[name] and name or name:gsub("^W_", "w_")] = true
    return spec_tensor(a.bytes, { dtype = NPY_DTYPE[a.dtype], offset = a.data_offset - 1, shape = a.shape },
      name, what, fold_leading)
  end
  T.W_enc, T.W_dec, T.b_enc, T.b_dec, T.threshold =
    take("W_enc", true), take("W_dec"), take("b_enc"), take("b_dec"), take("threshold")
  for _, n in ipairs(npz.names) do
    if not used[n] then fail(what, "holds array '%s', which a Gemma Scope JumpReLU SAE does not use", n) end
  end
  if #T.W_enc.shape ~= 2 then fail(what, "W_enc is not a matrix") end
  local d = { format = "gemma_scope", files = { weights = path }, cfg = {}, architecture = "jumprelu",
    cfg_architecture = "jumprelu", transcoder = false, apply_b_dec_to_input = false,
    normalize_activations = "none", reshape_activations = "none" }
  d.d_in, d.d_sae = T.W_enc.shape[1], T.W_enc.shape[2]
  d.d_out = d.d_in
  local cfgwhat = "W_enc's [d_in, d_sae]"
  check_shape(T.W_dec, d.d_sae, d.d_in, "W_dec", what, cfgwhat)
  check_vector(T.b_enc, d.d_sae, "b_enc", what, "d_sae")
  check_vector(T.b_dec, d.d_in, "b_dec", what, "d_in")
  check_vector(T.threshold, d.d_sae, "threshold", what, "d_sae")
  d.dtype = opts.dtype and dtype_of(opts.dtype, what, "dtype") or (T.W_enc.dtype == "F16" and "f16" or "f32")
  d.tensors = T
  -- The file names no hook; a folder named layer_N (Gemma Scope's layout) says which layer.
  local folder_layer = math.tointeger(tonumber(path:match("layer_(%d+)")))
  d.path_layer = folder_layer
  return d
end

-- ---- Llama Scope -----------------------------------------------------------------------------

local LLAMA_SCOPE_NORMS = { ["dataset-wise"] = "expected_average_only_in", ["token-wise"] = "constant_norm_rescale",
  inference = "none" }

local function llama_scope_scales(hp, what, opts, d_in)
  local norm = val(hp.norm_activation) or "dataset-wise"
  local n = LLAMA_SCOPE_NORMS[norm]
  if not n then
    fail(what, "norm_activation '%s' is not one of dataset-wise, token-wise, inference", tostring(norm))
  end
  if n ~= "expected_average_only_in" then return n end
  if opts.norm_scaling_factor then return n, opts.norm_scaling_factor, opts.norm_scaling_factor end
  local avg = val(hp.dataset_average_activation_norm)
  local a_in = type(avg) == "table" and val(avg["in"])
  local a_out = type(avg) == "table" and (val(avg.out) or a_in)
  if type(a_in) ~= "number" or a_in <= 0 or type(a_out) ~= "number" or a_out <= 0 then
    fail(what, "norm_activation = dataset-wise needs dataset_average_activation_norm.in (and .out) > 0")
  end
  -- Each row is scaled to the norm sqrt(d_model) on average (lm-saes' dataset-wise norm).
  return n, math.sqrt(d_in) / a_in, math.sqrt(d_in) / a_out
end

function M.llama_scope(dir, opts)
  local hp_path = fs.join(dir, "hyperparams.json")
  local hp = read_json(hp_path)
  local what = hp_path
  local d = { format = "llama_scope", cfg = hp, files = { cfg = hp_path }, reshape_activations = "none" }
  d.d_in = positive_int(val(hp.d_model) or val(hp.d_in), what, "d_model")
  d.d_sae = positive_int(hp.d_sae, what, "d_sae")
  d.hook = typed(val(hp.hook_point_in) or val(hp.hook_point), "string", what, "hook_point_in")
  if d.hook == nil then fail(what, "hook_point_in is missing") end
  d.hook_out = typed(val(hp.hook_point_out), "string", what, "hook_point_out") or d.hook
  d.transcoder = d.hook_out ~= d.hook
  d.hook_layer = layer_of(d.hook)
  d.hook_layer_out = d.transcoder and layer_of(d.hook_out) or nil
  local act = val(hp.act_fn) or "jumprelu"
  if act == "jumprelu" then
    d.architecture = "jumprelu"
    local t = val(hp.jump_relu_threshold)
    if type(t) ~= "number" then fail(what, "act_fn = jumprelu needs a numeric jump_relu_threshold") end
    d.threshold_all = t
  elseif act == "topk" then
    d.architecture = "topk"
    d.k = top_k(hp.top_k, d.d_sae, what, "top_k")
  elseif act == "relu" then
    d.architecture = "standard"
  else
    fail(what, "act_fn '%s' is not one of jumprelu, topk, relu", tostring(act))
  end
  d.cfg_architecture = d.architecture
  d.apply_b_dec_to_input = not d.transcoder and val(hp.apply_decoder_bias_to_pre_encoder) == true
  d.normalize_activations, d.scale_in, d.scale_out = llama_scope_scales(hp, what, opts, d.d_in)
  d.model_name = typed(val(hp.model_name), "string", what, "model_name")
  local wpath = fs.join(fs.join(dir, "checkpoints"), "final.safetensors")
  local content, st = open_safetensors(wpath)
  d.files.weights = wpath
  local T, used = {}, {}
  local function take(name, as)
    local e = st.tensors[name]
    if not e then fail(wpath, "has no tensor '%s' (Llama Scope: encoder.weight/bias, decoder.weight/bias)", name) end
    used[name] = true
    T[as] = spec_tensor(content, e, name, wpath, true)
    return T[as]
  end
  local enc, dec = take("encoder.weight", "W_enc"), take("decoder.weight", "W_dec")
  d.d_out = dec.shape[1]
  check_shape(enc, d.d_sae, d.d_in, "encoder.weight", wpath, "hyperparams' [d_sae, d_model]")
  check_shape(dec, d.d_out, d.d_sae, "decoder.weight", wpath, "[d_out, d_sae]")
  if not d.transcoder and d.d_out ~= d.d_in then
    fail(wpath, "decoder.weight has %d outputs, but an SAE (hook_point_in = hook_point_out) has d_model = %d",
      d.d_out, d.d_in)
  end
  check_vector(take("encoder.bias", "b_enc"), d.d_sae, "encoder.bias", wpath, "d_sae")
  check_vector(take("decoder.bias", "b_dec"), d.d_out, "decoder.bias", wpath, "d_out")
  for _, n in ipairs(st.names) do
    if not used[n] then fail(wpath, "holds tensor '%s', which a Llama Scope SAE does not use", n) end
  end
  d.tensors = T
  d.enc_by_feature, d.dec_by_output = true, true -- PyTorch Linear weights: [out, in]
  d.dtype = dtype_of(opts.dtype or enc.dtype:lower(), what, "dtype")
  return d
end

-- detect(path) -> the reader of the layout at path, or raises naming what was looked for.
function M.detect(path)
  if fs.is_dir(path) then
    if fs.exists(fs.join(path, "cfg.json")) then return M.saelens, path end
    if fs.exists(fs.join(path, "hyperparams.json")) then return M.llama_scope, path end
    if fs.exists(fs.join(path, "params.npz")) then return M.gemma_scope, fs.join(path, "params.npz") end
    fail("sae " .. path, "holds none of cfg.json (SAELens), hyperparams.json (Llama Scope), params.npz (Gemma Scope)")
  end
  if path:match("%.npz$") then return M.gemma_scope, path end
  local base = fs.basename(path)
  if base == "cfg.json" or base == "sae_weights.safetensors" then return M.saelens, fs.dirname(path) end
  if base == "hyperparams.json" then return M.llama_scope, fs.dirname(path) end
  if not fs.exists(path) then fail("sae " .. path, "does not exist") end
  fail("sae " .. path, "is not an SAE directory or a Gemma Scope .npz")
end

return M
