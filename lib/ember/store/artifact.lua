-- ember.store.artifact — the activation artifact: a directory holding manifest.json (provenance, run
-- settings, token ids, record index) and tensors.safetensors (the captured tensors).
-- Must not decide what to capture or how to compare; it writes atomically and verifies on read.
--
-- The format is documented in docs/artifacts.md; bump SCHEMA_VERSION's major part for any change
-- an older reader would misread.

local json = require("ember.store.json")
local fs = require("ember.store.fs")
local safetensors = require("ember.store.safetensors")
local selectors = require("ember.run.selectors")
local core = require("ember.core")
local shapes = require("ember.store.shape")

local M = {}

M.SCHEMA = "ember.activations"
-- 1.1.0: each record carries record_sha256, binding its fields to its bytes (1.0.x artifacts are
-- still read: their records are bound through the tensor name, which encodes the same fields).
M.SCHEMA_VERSION = "1.1.0"
M.SCHEMA_MAJOR = 1
-- Size limits of what read() takes in (core.read_file refuses larger files before reading).
M.MAX_MANIFEST_BYTES = 1 << 30
M.MAX_TENSOR_BYTES = 1 << 36
M.MANIFEST = "manifest.json"
M.TENSORS = "tensors.safetensors"

-- Top-level manifest keys in the order they are written (readers must not rely on the order).
M.KEY_ORDER = {
  "schema", "schema_version", "created_at_unix", "tool", "model", "tokenizer", "prompt",
  "input_ids", "generated_ids", "settings", "execution", "experiment", "capture", "argv",
  "tensor_file", "records",
}
local RECORD_KEYS = {
  "index", "name", "stage", "layer", "phase", "start_position", "shape", "dtype",
  "byte_order", "sha256", "record_sha256",
}

local function sha256(s)
  return core.sha256(s)
end

-- The alignment key of SPEC §6.3: (stage, layer, phase, start_position).
function M.record_key(r)
  return string.format("%s|%s|%s|%d", r.stage, r.layer == nil and "-" or tostring(r.layer), r.phase,
    r.start_position)
end

-- "after_mlp layer 4 decode @12" — how records are named in every message.
function M.record_label(r)
  local where = r.layer == nil and "" or (" layer " .. r.layer)
  return string.format("%s%s %s @%d", r.stage, where, r.phase, r.start_position)
end

local function tensor_name(i, r)
  local layer = r.layer == nil and "" or (".L" .. r.layer)
  return string.format("r%06d.%s%s.%s.p%d", i - 1, r.stage, layer, r.phase, r.start_position)
end

-- record_digest(r, name, data_sha256) -> the sha256 that binds a record's fields to its bytes: of
-- one line "name|stage|layer|phase|start_position|rows|cols|f32|little|data_sha256". Swapping two
-- records' layer, stage, start_position, or name and sha256, changes it.
function M.record_digest(r, name, data_sha256)
  return sha256(string.format("%s|%s|%s|%s|%d|%d|%d|f32|little|%s", name, r.stage,
    r.layer == nil and "-" or tostring(r.layer), r.phase, r.start_position, r.shape[1], r.shape[2],
    tostring(data_sha256)))
end

local function check_record_fields(r, where)
  if not selectors.STAGE_SET[r.stage] then error(where .. ": unknown stage '" .. tostring(r.stage) .. "'", 0) end
  local per_layer = selectors.LAYER_STAGE_SET[r.stage]
  if per_layer and (math.type(r.layer) ~= "integer" or r.layer < 0) then
    error(where .. ": stage " .. r.stage .. " needs a non-negative integer layer", 0)
  end
  if not per_layer and r.layer ~= nil then
    error(where .. ": stage " .. r.stage .. " has no layer (got " .. tostring(r.layer) .. ")", 0)
  end
  if r.phase ~= "prefill" and r.phase ~= "decode" then
    error(where .. ": phase must be prefill or decode, got '" .. tostring(r.phase) .. "'", 0)
  end
  if math.type(r.start_position) ~= "integer" or r.start_position < 0 then
    error(where .. ": start_position must be a non-negative integer", 0)
  end
  local shape = r.shape
  if type(shape) ~= "table" or #shape ~= 2 or math.type(shape[1]) ~= "integer" or math.type(shape[2]) ~= "integer"
    or shape[1] < 1 or shape[2] < 1 then
    error(where .. ": shape must be [rows, cols] of positive integers", 0)
  end
  -- at most what an ember.Tensor holds; the product never wraps ([2^32, 2^32] is not 0 values)
  return shapes.check(shape, shapes.MAX_TENSOR_VALUES, where)
end

-- check_record_fields(r, where): the record checks of the reader (stage, layer, phase,
-- start_position, shape), for records that come from elsewhere (an in-memory capture); raises
-- "<where>: ..." naming the first problem.
M.check_record_fields = check_record_fields

-- Sections every artifact carries (SPEC §6.1); the writer refuses to produce an artifact without them.
local REQUIRED = {
  { "model", "table" }, { "tokenizer", "table" }, { "prompt", "table" }, { "input_ids", "table" },
  { "generated_ids", "table" }, { "settings", "table" }, { "experiment", "table" }, { "capture", "table" },
  { "argv", "table" }, { "created_at_unix", "number" },
}
local REQUIRED_NESTED = {
  { "model", "sha256" }, { "model", "family" }, { "tokenizer", "sha256" }, { "prompt", "sha256" },
  { "capture", "config_sha256" }, { "experiment", "name" },
}

local function check_sections(m, where)
  for _, req in ipairs(REQUIRED) do
    if type(m[req[1]]) ~= req[2] then error(string.format("%s: missing or invalid '%s'", where, req[1]), 0) end
  end
  for _, req in ipairs(REQUIRED_NESTED) do
    if type(m[req[1]][req[2]]) ~= "string" then
      error(string.format("%s: missing or invalid '%s.%s'", where, req[1], req[2]), 0)
    end
  end
  for _, key in ipairs({ "input_ids", "generated_ids" }) do
    for i, id in ipairs(m[key]) do
      if math.type(id) ~= "integer" then error(string.format("%s: %s[%d] is not an integer", where, key, i), 0) end
    end
  end
end

-- write(dir, sections, records): sections are the manifest's provenance tables (model, tokenizer,
-- prompt, input_ids, generated_ids, settings, execution, experiment, capture, argv,
-- created_at_unix, tool); records are { stage, layer, phase, start_position, shape = {r, c},
-- tensor = an ember.Tensor of that shape | data = its little-endian f32 bytes [, sha256] }.
-- The directory appears complete or not at all; an existing `dir` is never overwritten.
function M.write(dir, sections, records)
  local where = "artifact '" .. dir .. "'"
  if fs.exists(dir) then
    error(where .. ": already exists (remove it or choose another directory)", 0)
  end
  check_sections(sections, where)
  local manifest = {}
  for k, v in pairs(sections) do manifest[k] = v end
  manifest.schema = M.SCHEMA
  manifest.schema_version = M.SCHEMA_VERSION
  manifest.input_ids = json.array(manifest.input_ids)
  manifest.generated_ids = json.array(manifest.generated_ids)
  manifest.argv = json.array(manifest.argv)

  local tensors, index = {}, json.array()
  for i, r in ipairs(records) do
    local rw = where .. " record " .. (i - 1)
    local count = check_record_fields(r, rw)
    local data = r.data
    if data == nil and r.tensor ~= nil then data = r.tensor:bytes() end
    if type(data) ~= "string" or #data ~= count * 4 then
      error(rw .. ": data must be " .. (count * 4) .. " bytes of f32", 0)
    end
    local digest = sha256(data)
    if r.sha256 and r.sha256 ~= digest then
      error(rw .. " (" .. M.record_label(r) .. "): sha256 of the data does not match the recorded sha256", 0)
    end
    local name = tensor_name(i, r)
    tensors[i] = { name = name, shape = r.shape, data = data }
    index[i] = json.ordered(RECORD_KEYS, {
      index = i - 1, name = name, stage = r.stage, layer = r.layer == nil and json.null or r.layer,
      phase = r.phase, start_position = r.start_position,
      shape = json.array({ r.shape[1], r.shape[2] }), dtype = "f32", byte_order = "little",
      record_sha256 = M.record_digest(r, name, digest),
      sha256 = digest,
    })
  end
  local blob = safetensors.encode(tensors, { format = "pt", schema = M.SCHEMA, schema_version = M.SCHEMA_VERSION })
  manifest.tensor_file = json.ordered({ "name", "size", "sha256" }, {
    name = M.TENSORS, size = #blob, sha256 = sha256(blob),
  })
  manifest.records = index
  local text = json.encode(json.ordered(M.KEY_ORDER, manifest), { indent = "  " })

  local parent = fs.dirname(dir)
  if not fs.is_dir(parent) then error(where .. ": parent directory '" .. parent .. "' does not exist", 0) end
  -- a killed run's half-written artifact directory goes first; the error names the temporary
  -- directory and why
  local tmp = fs.temp_dir_beside(dir, where)
  local wok, werr = pcall(function()
    fs.write_atomic(fs.join(tmp, M.TENSORS), blob, where)
    fs.write_atomic(fs.join(tmp, M.MANIFEST), text, where)
    local rok, rerr = os.rename(tmp, dir)
    if not rok then error(where .. ": cannot move into place: " .. tostring(rerr), 0) end
  end)
  if not wok then
    fs.remove_tree(tmp)
    error(werr, 0)
  end
  return manifest, sha256(text)
end

-- read_input(path, max, what) -> the bytes of a regular file of at most max bytes (fs.read: a FIFO,
-- a device or a directory is an error naming it, never a hang or an endless read).
local function read_input(path, max, what) return fs.read(path, what, max) end

local function major_of(version)
  return type(version) == "string" and tonumber(version:match("^(%d+)%.%d+%.%d+$")) or nil
end

-- read(dir) -> { dir, manifest, records = { {index, stage, layer, phase, start_position, shape,
-- sha256, tensor} } }, tensor an ember.Tensor. Verifies the schema, every record's sha256 against
-- its bytes and the tensor file's sha256; raises "artifact 'DIR': ..." naming the first problem.
function M.read(dir)
  local where = "artifact '" .. dir .. "'"
  if not fs.is_dir(dir) then error(where .. ": not a directory", 0) end
  local text = read_input(fs.join(dir, M.MANIFEST), M.MAX_MANIFEST_BYTES, where .. ": " .. M.MANIFEST)
  local m = json.decode(text, where .. ": " .. M.MANIFEST)
  if type(m) ~= "table" or m.schema ~= M.SCHEMA then
    error(where .. ": " .. M.MANIFEST .. " is not an ember activation artifact (schema '" ..
      tostring(type(m) == "table" and m.schema) .. "')", 0)
  end
  if major_of(m.schema_version) ~= M.SCHEMA_MAJOR then
    error(string.format("%s: unsupported schema_version '%s' (this ember reads %d.x)", where,
      tostring(m.schema_version), M.SCHEMA_MAJOR), 0)
  end
  check_sections(m, where)
  -- the prompt's text, when kept, is the text its sha256 names (manifest.prompt_section hashes it):
  -- an edited text no longer passes for the prompt the tensors were computed from
  if m.prompt.text ~= json.null and m.prompt.text ~= nil and
    (type(m.prompt.text) ~= "string" or sha256(m.prompt.text) ~= m.prompt.sha256) then
    error(where .. ": prompt.text does not match prompt.sha256: the manifest was edited", 0)
  end
  if type(m.records) ~= "table" or type(m.tensor_file) ~= "table" then
    error(where .. ": manifest has no records or tensor_file", 0)
  end
  if m.tensor_file.name ~= M.TENSORS then
    error(where .. ": tensor_file.name must be '" .. M.TENSORS .. "'", 0)
  end
  -- from 1.1 every record carries its record_sha256; 1.0.x records are bound by their tensor name
  local bound = m.schema_version ~= "1.0.0" and not m.schema_version:match("^1%.0%.")
  local blob = read_input(fs.join(dir, M.TENSORS), M.MAX_TENSOR_BYTES, where .. ": " .. M.TENSORS)
  local st = safetensors.decode(blob, where .. ": " .. M.TENSORS)

  local records, used = {}, {}
  for i, e in ipairs(m.records) do
    local rw = where .. " record " .. (i - 1)
    if type(e) ~= "table" then error(rw .. ": not an object", 0) end
    local r = {
      index = i - 1, stage = e.stage, layer = e.layer ~= json.null and e.layer or nil, phase = e.phase,
      start_position = e.start_position, shape = e.shape, sha256 = e.sha256, name = e.name,
    }
    check_record_fields(r, rw)
    rw = rw .. " (" .. M.record_label(r) .. ")"
    if e.dtype ~= "f32" then error(rw .. ": unsupported dtype '" .. tostring(e.dtype) .. "'", 0) end
    if e.byte_order ~= "little" then error(rw .. ": unsupported byte order '" .. tostring(e.byte_order) .. "'", 0) end
    -- the name encodes index, stage, layer, phase and position: a record whose fields were
    -- edited (or swapped with another's) no longer matches the tensor it names
    if type(r.name) == "string" and r.name ~= tensor_name(i, r) then
      error(string.format("%s: its fields do not match its tensor '%s' (expected '%s'): the manifest was edited",
        rw, r.name, tensor_name(i, r)), 0)
    end
    local t = type(r.name) == "string" and st.tensors[r.name]
    if not t then error(rw .. ": tensor '" .. tostring(r.name) .. "' is missing from " .. M.TENSORS, 0) end
    if used[r.name] then error(rw .. ": tensor '" .. r.name .. "' is referenced twice", 0) end
    used[r.name] = true
    if t.dtype ~= "F32" or #t.shape ~= 2 or t.shape[1] ~= r.shape[1] or t.shape[2] ~= r.shape[2] then
      error(rw .. ": tensor '" .. r.name .. "' has dtype/shape different from the manifest", 0)
    end
    local digest = sha256(t.data)
    if digest ~= r.sha256 then
      error(string.format("%s: sha256 mismatch (manifest %s, tensor bytes %s): the tensor file is corrupted",
        rw, tostring(r.sha256), digest), 0)
    end
    if bound and e.record_sha256 ~= M.record_digest(r, r.name, digest) then
      error(string.format("%s: record_sha256 %s does not match the record's fields and bytes: the manifest was "
        .. "edited", rw, e.record_sha256 == nil and "is missing, or" or tostring(e.record_sha256)), 0)
    end
    r.tensor = core.tensor_from_bytes(t.data, r.shape[1], r.shape[2])
    r.rows, r.cols = r.shape[1], r.shape[2]
    records[#records + 1] = r
  end
  for _, name in ipairs(st.names) do
    if not used[name] then error(where .. ": tensor '" .. name .. "' is not listed in the manifest", 0) end
  end
  if sha256(blob) ~= m.tensor_file.sha256 then
    error(where .. ": sha256 of " .. M.TENSORS .. " does not match the manifest", 0)
  end
  return { dir = dir, manifest = m, records = records, manifest_sha256 = sha256(text) }
end

return M
