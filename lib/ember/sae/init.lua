-- ember.sae — sparse autoencoders and transcoders (docs/sae.md): ember.sae.load reads a SAELens
-- directory, a Gemma Scope params.npz or a Llama Scope directory (ember.sae.formats) and builds an
-- engine SAE (core.sae_new); the object encodes and decodes in C. Must not run a model (the
-- splice, evaluation and top examples are their own modules) nor parse the files itself.

local core = require("ember.core")
local formats = require("ember.sae.formats")

local M = {}

M.LOAD_OPTIONS = { "hook", "hook_out", "model", "kernels", "threads", "dtype", "norm_scaling_factor" }

local SAE = {}
SAE.__index = SAE
SAE.__name = "ember.sae.SAE"

-- sae:encode(t) -> Tensor [rows, d_sae]: t is a [rows, d_in] Tensor or live view
function SAE:encode(t) return self.handle:encode(t) end
-- sae:decode(f [, x]) -> Tensor [rows, d_out]; x: the inputs f came from, which the row-dependent
-- normalisations (constant_norm_rescale, layer_norm) need to undo themselves
function SAE:decode(f, x) return self.handle:decode(f, x) end
-- sae:direction(feature) -> Tensor [1, d_out]: the decoder row of a feature (0-based)
function SAE:direction(i)
  if math.type(i) ~= "integer" then
    error("bad argument #1 to 'direction' (feature index expected, got " .. tostring(i) .. ")", 2)
  end
  return self.handle:direction(i)
end
-- sae:steering(model, feature, scale) -> the addition { layer, stage, vector, scale, source } that
-- steers `model` along feature's decoder direction where the SAE writes (its hook; a transcoder's
-- output hook), for ember.experiments.steer (the one owner of adding vectors). A head's SAE
-- (hook_z with hook_head_index) adds only in that head's columns.
function SAE:steering(model, feature, scale)
  if math.type(feature) ~= "integer" or feature < 0 or feature >= self.d_sae then
    error(string.format("sae %s: feature %s is not one of its %d (0-%d)", self.path, tostring(feature), self.d_sae,
      self.d_sae - 1), 0)
  end
  local _, out = require("ember.sae.splice").check(self, model)
  if out.stage == "before_logits" then
    error(string.format("sae %s: it writes %s, which is not a per-layer stage: it cannot be steered", self.path,
      out.stage), 0)
  end
  local dir = self.handle:direction(feature)
  if out.sliced then -- the head's columns of the whole attention_heads row
    local width = model.info.n_heads * model.info.head_dim
    local full = {}
    for j = 1, width do full[j] = 0.0 end
    for j = 1, self.d_out do full[out.col0 + j] = dir:get(1, j) end
    dir = core.tensor(1, width, full)
  end
  return { layer = out.layer, stage = out.stage, vector = dir, scale = scale,
    source = string.format("%s#feature=%d", self.path, feature) }
end

function SAE:close() self.handle:close() end
SAE.__close = SAE.close
function SAE:__tostring()
  return string.format("ember.sae.SAE(%s %s%s, %s, d_in=%d, d_sae=%d%s)", self.format, self.architecture,
    self.transcoder and " transcoder" or "", tostring(self.hook), self.d_in, self.d_sae,
    self.transcoder and (", d_out=" .. self.d_out) or "")
end

local ENGINE_NORM = { none = "none", expected_average_only_in = "scale",
  constant_norm_rescale = "constant_norm_rescale", layer_norm = "layer_norm" }

-- The engine's spec of a description (core.sae_new's fields, l_sae.c).
local function spec_of(d, opts)
  return {
    d_in = d.d_in, d_sae = d.d_sae, d_out = d.d_out, dtype = d.dtype, architecture = d.architecture, k = d.k,
    apply_b_dec_to_input = d.apply_b_dec_to_input,
    -- SAELens transcoders decode without undoing the input's normalisation (Transcoder.decode);
    -- Llama Scope's dataset-wise scales have an output factor of their own
    denormalize_output = not d.transcoder or d.normalize_activations == "expected_average_only_in",
    normalize = ENGINE_NORM[d.normalize_activations], scale_in = d.scale_in, scale_out = d.scale_out,
    enc_by_feature = d.enc_by_feature, dec_by_output = d.dec_by_output, threshold_all = d.threshold_all,
    kernels = opts.kernels, threads = opts.threads, tensors = d.tensors,
  }
end

local function check_load_options(opts)
  if type(opts) ~= "table" then
    error("bad argument #2 to 'sae.load' (table of options expected, got " .. type(opts) .. ")", 0)
  end
  core.internal.check_options(opts, "sae.load", M.LOAD_OPTIONS)
  for _, k in ipairs({ "hook", "hook_out", "kernels", "dtype" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "string" then
      error(string.format("bad argument #2 to 'sae.load' (option '%s' must be a string, got %s)", k, type(opts[k])), 0)
    end
  end
end

-- The hook the options give override the file's; Gemma Scope files name none.
local function apply_hook_options(d, opts, path)
  if opts.hook then
    d.hook = opts.hook
    d.hook_layer = formats.layer_of(opts.hook) or d.hook_layer
  end
  if opts.hook_out then d.hook_out = opts.hook_out end
  if type(d.hook) ~= "string" or d.hook == "" then
    error(string.format("sae %s: the file names no hook; give one: ember.sae.load(path, { hook = "
      .. "'blocks.12.hook_resid_post' }) (--sae-hook on the command line)", path), 0)
  end
  local layer = formats.layer_of(d.hook)
  if d.hook_layer ~= nil and layer ~= nil and d.hook_layer ~= layer then
    error(string.format("sae %s: hook_layer %s contradicts hook_name '%s' (layer %d)", path, tostring(d.hook_layer),
      d.hook, layer), 0)
  end
  if d.path_layer and layer and d.path_layer ~= layer then
    error(string.format("sae %s: hook '%s' is layer %d, but the file sits in a layer_%d folder", path, d.hook, layer,
      d.path_layer), 0)
  end
  d.hook_layer = layer or d.hook_layer
  if d.transcoder then
    if type(d.hook_out) ~= "string" or d.hook_out == "" then
      error(string.format("sae %s: a transcoder needs hook_name_out (or ember.sae.load(path, { hook_out = ... }))",
        path), 0)
    end
    d.hook_layer_out = formats.layer_of(d.hook_out) or d.hook_layer_out
  end
end

-- ember.sae.load(path [, opts]) -> SAE
-- opts: hook (TransformerLens name; overrides the file's, needed for Gemma Scope), hook_out (a
-- transcoder's output hook), model (an ember.Model: its compute context runs the products, and the
-- SAE is checked against it), kernels, threads (the SAE's own compute when no model is given),
-- dtype ("f32" | "f16" | "bf16": the products' weight type instead of the file's), and
-- norm_scaling_factor (expected_average_only_in's factor when the file lacks it).
function M.load(path, opts)
  if type(path) ~= "string" or path == "" then
    error("bad argument #1 to 'sae.load' (SAE directory or file expected, got " .. type(path) .. ")", 2)
  end
  opts = opts or {}
  check_load_options(opts)
  local reader, where = formats.detect(path)
  local d = reader(where, opts)
  apply_hook_options(d, opts, path)
  -- what the engine refuses of a file the readers passed is named by the file too (never by a
  -- source line of this library)
  local made, handle = pcall(core.sae_new, spec_of(d, opts), opts.model)
  if not made then
    error(string.format("sae %s: %s", path, (tostring(handle):gsub("^[^\n]-%.lua:%d+: ", ""))), 0)
  end
  local sae = setmetatable({ handle = handle, path = path }, SAE)
  for _, k in ipairs({ "format", "files", "architecture", "transcoder", "d_in", "d_sae", "d_out", "dtype", "k",
    "apply_b_dec_to_input", "normalize_activations", "scale_in", "scale_out", "reshape_activations", "hook",
    "hook_layer", "hook_head_index", "hook_out", "hook_layer_out", "model_name", "cfg" }) do
    sae[k] = d[k]
  end
  sae.kernels = handle.kernels
  if d.sparsity then
    local vals = formats.values_of(d.sparsity)
    sae.log_sparsity = core.tensor(1, #vals, vals)
  end
  return sae
end

-- ember.sae.wrap(handle, fields) -> an SAE object over an engine SAE made by core.sae_new from a
-- spec of one's own (benchmarks); fields: what ember.sae.load would have read (path, d_in, d_sae,
-- d_out, architecture, hook, hook_layer, transcoder, ...).
function M.wrap(handle, fields)
  fields.handle = handle
  fields.kernels = handle.kernels
  return setmetatable(fields, SAE)
end

-- ember.sae.is_sae(v) -> whether v is an SAE object of this module
function M.is_sae(v) return getmetatable(v) == SAE end

return M
