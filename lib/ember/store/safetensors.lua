-- ember.store.safetensors — the safetensors container: an 8-byte little-endian header length, a JSON
-- header, then the raw tensor bytes. Must not interpret what the tensors mean (artifact.lua does).
--
-- Layout (https://github.com/huggingface/safetensors, "Format"):
--   u64 LE  N            size of the header
--   N bytes              JSON object: name -> {dtype, shape, data_offsets=[begin,end)},
--                        optional "__metadata__": {string: string}; padded with spaces
--   rest                 byte buffer; offsets are relative to its start
-- Only F32 is written here (activations are f32 in this version); the reader accepts the common
-- dtypes so that a file from elsewhere gives a clear "unsupported dtype" later, not a parse error.

local json = require("ember.store.json")
local shapes = require("ember.store.shape")

local M = {}

local DTYPE_SIZE = {
  F64 = 8, F32 = 4, F16 = 2, BF16 = 2, I64 = 8, I32 = 4, I16 = 2, I8 = 1, U8 = 1, BOOL = 1,
}

-- The reader refuses headers larger than this: a corrupted length must not make it read gigabytes.
local MAX_HEADER = 100 * 1024 * 1024

-- header(tensors, metadata) -> the bytes before the tensor data: the length and the JSON header.
-- tensors: list of { name = s, shape = {rows, cols}, size = bytes of f32 data }, in data order.
function M.header(tensors, metadata)
  local header_keys, header = { "__metadata__" }, {}
  if metadata and next(metadata) then header.__metadata__ = metadata end
  local offset, seen = 0, {}
  for i, t in ipairs(tensors) do
    assert(type(t.name) == "string" and t.name ~= "" and t.name ~= "__metadata__",
      "safetensors: tensor " .. i .. " needs a name")
    assert(not seen[t.name], "safetensors: duplicate tensor name '" .. t.name .. "'")
    seen[t.name] = true
    local n = shapes.check(t.shape, t.size // 4, "safetensors: tensor '" .. t.name .. "'")
    assert(t.size == n * 4, string.format("safetensors: tensor '%s' has %d bytes, shape needs %d",
      t.name, t.size, n * 4))
    header_keys[#header_keys + 1] = t.name
    header[t.name] = json.ordered({ "dtype", "shape", "data_offsets" }, {
      dtype = "F32", shape = json.array({ table.unpack(t.shape) }),
      data_offsets = json.array({ offset, offset + t.size }),
    })
    offset = offset + t.size
  end
  local text = json.encode(json.ordered(header_keys, header))
  -- pad so the byte buffer starts 8-aligned (what the reference implementation does)
  text = text .. string.rep(" ", (8 - (#text % 8)) % 8)
  return string.pack("<I8", #text) .. text
end

-- encode(tensors, metadata) -> file content.
-- tensors: list of { name = s, shape = {rows, cols}, data = little-endian f32 bytes }
function M.encode(tensors, metadata)
  local sized, parts = {}, {}
  for i, t in ipairs(tensors) do
    sized[i] = { name = t.name, shape = t.shape, size = #t.data }
    parts[i + 1] = t.data
  end
  parts[1] = M.header(sized, metadata)
  return table.concat(parts)
end

local function fail(what, msg, ...)
  error(string.format("%s: " .. msg, what, ...), 0)
end

-- decode(content, what [, opts]) -> { metadata = {..}, tensors = { [name] = {dtype, shape, data} },
-- names = {...} }. `names` lists the tensors in data order. opts.copy = false: each tensor gets
-- `offset` (0-based, into content) in place of a copy of its bytes, for files too large to copy.
-- Raises "<what>: ..." for anything malformed.
function M.decode(content, what, opts)
  local copy = not (opts and opts.copy == false)
  what = what or "safetensors"
  if #content < 8 then fail(what, "file too short (%d bytes) for a safetensors header", #content) end
  local n = string.unpack("<I8", content)
  if n < 2 or n > MAX_HEADER or n > #content - 8 then
    fail(what, "header length %s does not fit the file (%d bytes)", string.format("%u", n), #content)
  end
  local text = content:sub(9, 8 + n)
  if text:sub(1, 1) ~= "{" then fail(what, "header does not start with '{'") end
  local header = json.decode(text, what .. " header")
  if type(header) ~= "table" then fail(what, "header is not a JSON object") end
  local data_start = 8 + n
  local data_len = #content - data_start
  local out = { metadata = {}, tensors = {}, names = {} }
  local spans = {}
  for name, e in pairs(header) do
    if name == "__metadata__" then
      if type(e) ~= "table" then fail(what, "__metadata__ is not an object") end
      for k, v in pairs(e) do
        if type(v) ~= "string" then fail(what, "__metadata__ value for '%s' is not a string", k) end
        out.metadata[k] = v
      end
    else
      if type(e) ~= "table" then fail(what, "entry '%s' is not an object", name) end
      local size = DTYPE_SIZE[e.dtype]
      if not size then fail(what, "tensor '%s' has unknown dtype '%s'", name, tostring(e.dtype)) end
      if type(e.shape) ~= "table" then fail(what, "tensor '%s' has no shape", name) end
      for i, d in ipairs(e.shape) do
        if math.type(d) ~= "integer" or d < 0 then fail(what, "tensor '%s' dimension %d is invalid", name, i) end
      end
      local off = e.data_offsets
      if type(off) ~= "table" or math.type(off[1]) ~= "integer" or math.type(off[2]) ~= "integer"
        or off[1] < 0 or off[2] < off[1] or off[2] > data_len then
        fail(what, "tensor '%s' has data_offsets outside the %d-byte buffer", name, data_len)
      end
      -- the count bounded by the bytes the tensor spans, so no product can wrap (2^32 x 2^32 is not 0)
      local count, why = shapes.count(e.shape, (off[2] - off[1]) // size)
      if not count then fail(what, "tensor '%s' shape %s (it spans %d bytes)", name, why, off[2] - off[1]) end
      if off[2] - off[1] ~= count * size then
        fail(what, "tensor '%s' spans %d bytes but shape and dtype need %d", name, off[2] - off[1], count * size)
      end
      out.tensors[name] = {
        dtype = e.dtype, shape = e.shape,
        data = copy and content:sub(data_start + off[1] + 1, data_start + off[2]) or nil,
        offset = not copy and data_start + off[1] or nil,
      }
      spans[#spans + 1] = { off[1], off[2], name }
    end
  end
  -- The buffer must be covered exactly once: overlapping or stray bytes mean a damaged file.
  table.sort(spans, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local pos = 0
  for _, s in ipairs(spans) do
    if s[1] ~= pos then fail(what, "tensor '%s' does not start where the previous one ends", s[3]) end
    pos = s[2]
    out.names[#out.names + 1] = s[3]
  end
  if pos ~= data_len then fail(what, "%d bytes after the last tensor", data_len - pos) end
  return out
end

return M
