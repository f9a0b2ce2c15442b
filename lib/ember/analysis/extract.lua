-- ember.analysis.extract — hidden-state extraction: the residual stream after chosen layers for every
-- prompt token (a read-only after_layer hook), written as safetensors with a JSON sidecar.
-- Must not change any value it sees, nor run with an experiment (the CLI refuses that, SPEC §7).
--
-- Files (docs/extraction.md): FILE.safetensors holds one F32 tensor per (prompt, layer), named
-- "hidden.p<prompt index, 0-based>.L<layer>", shape [prompt tokens, hidden_size]; FILE.json (the
-- sidecar) holds the provenance, the prompts with their labels and token ids, and the sha256 of
-- the tensor file, so that a reader can tell the two belong together.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local manifest = require("ember.store.manifest")
local safetensors = require("ember.store.safetensors")
local core = require("ember.core")

local M = {}

M.SCHEMA = "ember.hidden_states"
M.SCHEMA_VERSION = "1.0.0"
M.SCHEMA_MAJOR = 1
M.STAGE = "after_layer"
-- a JSONL line longer than this is refused rather than decoded (a prompt is text, not a corpus)
M.MAX_LINE = 1 << 20
-- fs.read's bounds: a prompts file (--prompts, probe --data), an extraction's sidecar and its tensors
M.MAX_PROMPTS_BYTES = 1 << 30
M.MAX_SIDECAR_BYTES = 1 << 30
M.MAX_TENSOR_BYTES = 1 << 36

local sha256 = core.sha256

-- tensor_name(i, layer) -> the tensor of prompt i (1-based here, 0-based in the name) at layer.
function M.tensor_name(i, layer) return string.format("hidden.p%d.L%d", i - 1, layer) end

-- sidecar_path(path) -> where the JSON sidecar of a tensor file goes: x.safetensors -> x.json,
-- any other name gets ".json" appended.
function M.sidecar_path(path)
  local base = path:match("^(.*)%.safetensors$")
  return (base or path) .. ".json"
end

-- ---- prompts ------------------------------------------------------------------------------------

-- read_prompts(path, what, need_label) -> list of { prompt = text, label = value|nil, line = n },
-- the file's sha256. One JSON object per line: {"prompt": "...", "label": ...} (label optional
-- unless need_label; a string or an integer). Blank lines are skipped. Errors name what:line.
function M.read_prompts(path, what, need_label)
  local data = fs.read(path, what, M.MAX_PROMPTS_BYTES)
  local list = {}
  local n = 0
  for line in (data .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    line = line:gsub("\r$", "")
    if not line:match("^%s*$") then
      local where = string.format("%s: '%s' line %d", what, path, n)
      if #line > M.MAX_LINE then error(string.format("%s: longer than %d bytes", where, M.MAX_LINE), 0) end
      local okd, v = pcall(json.decode, line, where)
      if not okd then error(v, 0) end
      if type(v) ~= "table" or v[1] ~= nil then error(where .. ": expected a JSON object {\"prompt\": ...}", 0) end
      if type(v.prompt) ~= "string" then
        error(where .. ": field \"prompt\" must be a string, got " .. (v.prompt == nil and "none" or type(v.prompt)), 0)
      end
      if v.prompt == "" then error(where .. ": field \"prompt\" is empty", 0) end
      local label = v.label
      if label == json.null then label = nil end
      if label ~= nil and type(label) ~= "string" and math.type(label) ~= "integer" then
        error(where .. ": field \"label\" must be a string or an integer, got " .. type(label), 0)
      end
      if need_label and label == nil then error(where .. ": field \"label\" is missing (a probe needs labels)", 0) end
      for k in pairs(v) do
        if k ~= "prompt" and k ~= "label" then error(where .. ": unknown field \"" .. tostring(k) .. "\"", 0) end
      end
      list[#list + 1] = { prompt = v.prompt, label = label, line = n }
    end
  end
  if #list == 0 then error(string.format("%s: '%s' holds no prompts", what, path), 0) end
  return list, sha256(data)
end

-- ---- extraction ---------------------------------------------------------------------------------

-- check_layers(layers, info) -> the sorted layer list ("all" expanded), or nil and a message.
function M.check_layers(layers, info)
  if layers == "all" then
    local all = {}
    for l = 0, info.n_layers - 1 do all[#all + 1] = l end
    return all
  end
  for _, l in ipairs(layers) do
    if l >= info.n_layers then
      return nil, string.format("layer %d is out of range (the model has %d layers: 0-%d)", l, info.n_layers,
        info.n_layers - 1)
    end
  end
  return layers
end

-- reader(layers) -> a read-only experiment keeping each selected layer's after_layer output of
-- the prefill (every prompt token) as bytes in exp.hidden[layer]; exp.rows[layer] its row count.
function M.reader(layers)
  local want = {}
  for _, l in ipairs(layers) do want[l] = true end
  local exp = { name = "extract_hidden", hidden = {}, rows = {} }
  exp.after_layer = function(self, ctx, view)
    if ctx.phase ~= "prefill" or not want[ctx.layer_index] then return end
    self.hidden[ctx.layer_index] = view:bytes()
    self.rows[ctx.layer_index] = view:shape()[1]
  end
  return exp
end

-- run(model, prompts, layers [, progress]) -> list of { prompt, label, ids, hidden = {[layer] =
-- bytes} }: one prefill per prompt (nothing is generated). progress: a reporter with
-- :start(n), :step(), :finish(ok) (ember.sweep.progress), or nil.
function M.run(model, prompts, layers, progress)
  local results = {}
  if progress then progress:start(#prompts, 0) end
  local ok, err = pcall(function()
    for i, p in ipairs(prompts) do
      local exp = M.reader(layers)
      local out = model:generate { prompt = p.prompt, max_tokens = 0, experiment = exp }
      for _, l in ipairs(layers) do
        if exp.hidden[l] == nil then
          error(string.format("prompt %d: layer %d produced no after_layer output", i, l), 0)
        end
        if exp.rows[l] ~= #out.prompt_ids then
          error(string.format("prompt %d: layer %d gave %d rows for %d tokens", i, l, exp.rows[l], #out.prompt_ids), 0)
        end
      end
      results[i] = { prompt = p.prompt, label = p.label, ids = out.prompt_ids, hidden = exp.hidden }
      if progress then progress:step() end
    end
  end)
  if progress then progress:finish(ok) end
  if not ok then error(err, 0) end
  return results
end

-- hidden(opts) -> ember.extract_hidden{ model =, prompts = { text | { prompt =, label = }, ... },
-- layers = "all" | { 0, 2 } | "0,2-3" } -> list of { prompt, label, ids, hidden = { [layer] =
-- Tensor [tokens, hidden_size] } }: the same reading as --extract-hidden, as tensors, for scripts.
local HIDDEN_OPTIONS = { "model", "prompts", "layers" }
function M.hidden(opts)
  local function bad(msg) error("bad argument to 'extract_hidden' (" .. msg .. ")", 3) end
  if type(opts) ~= "table" then bad("table expected, got " .. type(opts)) end
  require("ember.core").internal.check_options(opts, "extract_hidden", HIDDEN_OPTIONS)
  local model = opts.model
  if model == nil then bad("model= is required") end
  local info = model.info -- raises for a closed model
  if type(opts.prompts) ~= "table" or #opts.prompts == 0 then bad("prompts= must be a non-empty list") end
  local prompts = {}
  for i, p in ipairs(opts.prompts) do
    if type(p) == "string" then p = { prompt = p } end
    if type(p) ~= "table" or type(p.prompt) ~= "string" then
      bad(string.format("prompts[%d] must be a string or { prompt = text, label = ... }", i))
    end
    prompts[i] = { prompt = p.prompt, label = p.label }
  end
  local layers = opts.layers or "all"
  if type(layers) == "string" then
    local err
    layers, err = require("ember.run.selectors").parse_index_list(layers, "layer")
    if not layers then bad("layers: " .. err) end
  elseif type(layers) ~= "table" then
    bad("layers must be \"all\", a list of layers or a string like \"0,2-3\"")
  end
  local checked, err = M.check_layers(layers, info)
  if not checked then bad("layers: " .. err) end
  local results = M.run(model, prompts, checked)
  for _, r in ipairs(results) do
    for l, bytes in pairs(r.hidden) do r.hidden[l] = core.tensor_from_bytes(bytes, #r.ids, info.hidden_size) end
  end
  return results
end

-- ---- the files ----------------------------------------------------------------------------------

local SIDECAR_ORDER = { "schema", "schema_version", "created_at_unix", "tool", "model", "tokenizer", "execution",
  "stage", "phase", "layers", "dtype", "byte_order", "hidden_size", "tensor_file", "data", "prompt_count",
  "token_count", "prompts", "argv" }
local PROMPT_ORDER = { "index", "line", "prompt", "label", "input_ids", "tensors" }

-- write(path, results, p) -> sidecar document. p: { model, layers, tokenizer_path, data = { source
-- = "prompt"|"jsonl", path, sha256 }, argv }. The tensor file is written first, then the sidecar
-- that names its sha256; both atomically, so a reader sees old or new files, never a part.
function M.write(path, results, p)
  local model, layers = p.model, p.layers
  local hidden = model.info.hidden_size
  local tensors, prompts, tokens = {}, json.array(), 0
  for i, r in ipairs(results) do
    local names = {}
    for _, l in ipairs(layers) do
      local name = M.tensor_name(i, l)
      tensors[#tensors + 1] = { name = name, shape = { #r.ids, hidden }, data = r.hidden[l] }
      names[tostring(l)] = name
    end
    tokens = tokens + #r.ids
    prompts[i] = json.ordered(PROMPT_ORDER, {
      index = i - 1, line = r.line, prompt = manifest.prompt_section(r.prompt, r.ids, false),
      label = r.label == nil and json.null or r.label, input_ids = json.array({ table.unpack(r.ids) }),
      tensors = names,
    })
  end
  local sidecar = M.sidecar_path(path)
  local blob = safetensors.encode(tensors, { format = M.SCHEMA, sidecar = fs.basename(sidecar) })
  fs.write_atomic(path, blob, "--extract-out")
  local model_section = manifest.model_section(model)
  local argv = json.array()
  for i, a in ipairs(p.argv or {}) do argv[i] = tostring(a) end
  local doc = json.ordered(SIDECAR_ORDER, {
    schema = M.SCHEMA, schema_version = M.SCHEMA_VERSION, created_at_unix = os.time(),
    tool = json.ordered({ "name", "version" }, { name = "ember", version = core.version }),
    model = model_section, tokenizer = manifest.tokenizer_section(p.tokenizer_path, model_section.sha256),
    execution = manifest.execution_section(model), stage = M.STAGE, phase = "prefill",
    layers = json.array({ table.unpack(layers) }), dtype = "F32", byte_order = "little", hidden_size = hidden,
    tensor_file = json.ordered({ "path", "sha256", "bytes" }, { path = fs.basename(path), sha256 = sha256(blob),
      bytes = #blob }),
    data = json.ordered({ "source", "path", "sha256" }, p.data), prompt_count = #results, token_count = tokens,
    prompts = prompts, argv = argv,
  })
  fs.write_atomic(sidecar, json.encode(doc, { indent = "  " }), "--extract-out sidecar")
  return doc
end

-- read(path) -> { sidecar = doc, tensors = { name -> {dtype, shape, data} } }: an extraction file
-- and its sidecar, checked against each other (schema, tensor file sha256, every named tensor
-- present with [tokens, hidden_size] F32). Errors name the file.
function M.read(path)
  local sidecar = M.sidecar_path(path)
  if not fs.exists(sidecar) then
    error(string.format("'%s': its sidecar '%s' is missing (an extraction is written as both)", path, sidecar), 0)
  end
  local doc = json.decode(fs.read(sidecar, "extraction sidecar", M.MAX_SIDECAR_BYTES), "'" .. sidecar .. "'")
  if type(doc) ~= "table" or doc.schema ~= M.SCHEMA then
    error(string.format("'%s' is not an ember hidden-state sidecar (schema %s)", sidecar,
      tostring(type(doc) == "table" and doc.schema)), 0)
  end
  local major = tonumber(tostring(doc.schema_version):match("^(%d+)%."))
  if major ~= M.SCHEMA_MAJOR then
    error(string.format("'%s': schema_version %s is not readable here (major %d)", sidecar,
      tostring(doc.schema_version), M.SCHEMA_MAJOR), 0)
  end
  local blob = fs.read(path, "extraction", M.MAX_TENSOR_BYTES)
  if type(doc.tensor_file) ~= "table" or sha256(blob) ~= doc.tensor_file.sha256 then
    error(string.format("'%s' does not match its sidecar '%s' (tensor file sha256 differs)", path, sidecar), 0)
  end
  local st = safetensors.decode(blob, "'" .. path .. "'")
  for i, pr in ipairs(doc.prompts or {}) do
    for l, name in pairs(pr.tensors or {}) do
      local t = st.tensors[name]
      if not t or t.dtype ~= "F32" or t.shape[1] ~= #pr.input_ids or t.shape[2] ~= doc.hidden_size then
        error(string.format("'%s': tensor '%s' (prompt %d, layer %s) is missing or has the wrong shape", path,
          name, i - 1, l), 0)
      end
    end
  end
  return { sidecar = doc, tensors = st.tensors }
end

return M
