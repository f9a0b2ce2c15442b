-- ember.store.tensor_file — ember.save_tensors / ember.load_tensors: named tensors (a steering vector, a
-- probe direction) kept in one safetensors file. Must not have a format of its own: the container
-- and its header checks are ember.store.safetensors', the same the artifact reader uses; writes are
-- atomic (ember.store.fs).

local safetensors = require("ember.store.safetensors")
local fs = require("ember.store.fs")

local M = {}

-- The largest file load_tensors reads (as an artifact's tensors.safetensors).
M.MAX_BYTES = 1 << 36

local function core() return require("ember.core") end

local function is_tensor(v)
  local mt = getmetatable(v)
  local name = type(mt) == "table" and rawget(mt, "__name")
  return name == "ember.Tensor" or name == "ember.TensorView"
end

local function is_cache(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__name") == "ember.ActivationCache"
end

-- A whole ActivationCache as named tensors: each under its TransformerLens name (cache:keys():
-- blocks.3.hook_resid_post, ...; a stage TransformerLens has no hook for under its own name), the
-- logits as "logits", and the token ids in the metadata ("ids", comma-separated) unless given.
local function cache_tensors(cache, metadata)
  local named = { logits = cache.logits }
  for _, name in ipairs(cache:keys()) do named[name] = cache:get(name) end
  local meta = {}
  for k, v in pairs(metadata or {}) do meta[k] = v end
  if meta.ids == nil then
    local ids = {}
    for i, id in ipairs(cache.ids) do ids[i] = tostring(id) end
    meta.ids = table.concat(ids, ",")
  end
  return named, meta
end

-- save_tensors(path, { name = tensor, ... } | cache [, metadata]) -> true
-- Tensors are written as F32 [rows, cols] under their names, sorted (the same input gives the
-- same bytes); metadata is an optional table of string -> string (safetensors' __metadata__).
-- An ActivationCache is written whole, under TransformerLens names (cache_tensors above).
function M.save(path, tensors, metadata)
  if is_cache(tensors) then tensors, metadata = cache_tensors(tensors, metadata) end
  if type(path) ~= "string" or path == "" then
    error("bad argument #1 to 'save_tensors' (file path expected, got " .. type(path) .. ")", 2)
  end
  if type(tensors) ~= "table" then
    error("bad argument #2 to 'save_tensors' (table of name = tensor expected, got " .. type(tensors) .. ")", 2)
  end
  local names = {}
  for name, t in pairs(tensors) do
    if type(name) ~= "string" or name == "" or name == "__metadata__" then
      error("bad argument #2 to 'save_tensors' (tensor names must be non-empty strings other than "
        .. "'__metadata__', got " .. (type(name) == "string" and ("'" .. name .. "'") or type(name)) .. ")", 2)
    end
    if not is_tensor(t) then
      error("bad argument #2 to 'save_tensors' ('" .. name .. "' is a " .. type(t) .. ", not an ember.Tensor)", 2)
    end
    names[#names + 1] = name
  end
  table.sort(names)
  local meta = {}
  for k, v in pairs(metadata or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error("bad argument #3 to 'save_tensors' (metadata must map strings to strings)", 2)
    end
    meta[k] = v
  end
  local list = {}
  for i, name in ipairs(names) do
    local t = tensors[name]
    local shape = t:shape() -- raises for an expired view
    list[i] = { name = name, shape = { shape[1], shape[2] }, data = t:bytes() }
  end
  fs.write_atomic(path, safetensors.encode(list, meta), "save_tensors")
  return true
end

-- load_tensors(path) -> { name = ember.Tensor, ... }, metadata
-- Accepts F32 tensors of rank 1 (as [1, n]) or 2; anything else is refused naming the tensor.
function M.load(path)
  if type(path) ~= "string" then
    error("bad argument #1 to 'load_tensors' (file path expected, got " .. type(path) .. ")", 2)
  end
  local what = "load_tensors: " .. path
  local st = safetensors.decode(fs.read(path, what, M.MAX_BYTES), what)
  local out = {}
  for _, name in ipairs(st.names) do
    local e = st.tensors[name]
    if e.dtype ~= "F32" then
      error(string.format("%s: tensor '%s' is %s (only F32 is read)", what, name, e.dtype), 0)
    end
    local rows, cols
    if #e.shape == 1 then rows, cols = 1, e.shape[1]
    elseif #e.shape == 2 then rows, cols = e.shape[1], e.shape[2]
    else
      error(string.format("%s: tensor '%s' has rank %d (ember tensors are [rows, cols])", what, name, #e.shape), 0)
    end
    if rows < 1 or cols < 1 then error(string.format("%s: tensor '%s' is empty", what, name), 0) end
    out[name] = core().tensor_from_bytes(e.data, rows, cols)
  end
  return out, st.metadata
end

return M
