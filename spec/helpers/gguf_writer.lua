-- helpers.gguf_writer — writes small GGUF v3 files from Lua for the specs: string and integer
-- metadata and f32 tensors, laid out as the GGUF format says (little-endian, 32-byte alignment).
-- Independent of ember's own GGUF code, so a spec can hand ember a file made the way llama.cpp's
-- cvector-generator makes it (general.architecture "controlvector", direction.N tensors).

local M = {}

local GGUF_U32, GGUF_I32, GGUF_F32, GGUF_STRING = 4, 5, 6, 8
local TYPE_F32 = 0
local ALIGN = 32

local function str(s) return string.pack("<I8", #s) .. s end

-- write(path, { kv = { {key, "string"|"i32"|"u32"|"f32", value}, ... },
--               tensors = { {name = "direction.1", shape = {n}, values = {...}, type = 0 (f32)} ... } })
-- A tensor may give raw `data` bytes instead of values (and a `type` other than f32) to make
-- malformed files on purpose.
function M.write(path, spec)
  local parts = { "GGUF", string.pack("<I4I8I8", 3, #(spec.tensors or {}), #(spec.kv or {})) }
  for _, kv in ipairs(spec.kv or {}) do
    local key, kind, value = kv[1], kv[2], kv[3]
    if kind == "string" then
      parts[#parts + 1] = str(key) .. string.pack("<I4", GGUF_STRING) .. str(value)
    elseif kind == "i32" then
      parts[#parts + 1] = str(key) .. string.pack("<I4i4", GGUF_I32, value)
    elseif kind == "u32" then
      parts[#parts + 1] = str(key) .. string.pack("<I4I4", GGUF_U32, value)
    elseif kind == "f32" then
      parts[#parts + 1] = str(key) .. string.pack("<I4f", GGUF_F32, value)
    else
      error("gguf_writer: unknown value kind " .. tostring(kind))
    end
  end
  local blobs, offset = {}, 0
  for i, t in ipairs(spec.tensors or {}) do
    local data = t.data
    if not data then
      local vals = {}
      for j, v in ipairs(t.values) do vals[j] = string.pack("<f", v) end
      data = table.concat(vals)
    end
    local info = str(t.name) .. string.pack("<I4", #t.shape)
    for _, d in ipairs(t.shape) do info = info .. string.pack("<I8", d) end
    info = info .. string.pack("<I4I8", t.type or TYPE_F32, offset)
    parts[#parts + 1] = info
    local padded = data .. string.rep("\0", (ALIGN - #data % ALIGN) % ALIGN)
    blobs[i] = padded
    offset = offset + #padded
  end
  local head = table.concat(parts)
  head = head .. string.rep("\0", (ALIGN - #head % ALIGN) % ALIGN)
  local f = assert(io.open(path, "wb"))
  f:write(head, table.concat(blobs))
  f:close()
  return path
end

-- control_vector(path, directions [, opts]) -> path: a file as cvector-generator writes it.
-- directions = { [N] = { values... }, ... } (N >= 1); opts.model_hint (default "llama").
function M.control_vector(path, directions, opts)
  opts = opts or {}
  local layers = {}
  for n in pairs(directions) do layers[#layers + 1] = n end
  table.sort(layers)
  local tensors = {}
  for _, n in ipairs(layers) do
    tensors[#tensors + 1] = { name = "direction." .. n, shape = { #directions[n] }, values = directions[n] }
  end
  return M.write(path, {
    kv = {
      { "general.architecture", "string", opts.architecture or "controlvector" },
      { "controlvector.model_hint", "string", opts.model_hint or "llama" },
      { "controlvector.layer_count", "i32", #layers },
    },
    tensors = tensors,
  })
end

return M
