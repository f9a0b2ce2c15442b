-- helpers.gguf — a small GGUF reader for specs: scalar metadata, the tensor table, and rows of
-- f32/f16/bf16/q8_0 tensors decoded with string.unpack. Independent of ember's C reader, so a
-- spec can check what ember reports about a file against the file's own bytes. Trusts its input
-- (fixtures only): no hostile-file checks.

local M = {}

-- Byte sizes of the scalar metadata value types (GGUF value type ids).
local SCALAR = { [0] = "B", [1] = "b", [2] = "<I2", [3] = "<i2", [4] = "<I4", [5] = "<i4", [6] = "<f",
  [7] = "B", [10] = "<I8", [11] = "<i8", [12] = "<d" }
local SCALAR_SIZE = { [0] = 1, [1] = 1, [2] = 2, [3] = 2, [4] = 4, [5] = 4, [6] = 4, [7] = 1, [10] = 8, [11] = 8,
  [12] = 8 }

-- Reads a value of type t at pos; returns value (nil for arrays) and the next position.
local function read_value(s, t, pos)
  if SCALAR[t] then
    local v, next_pos = string.unpack(SCALAR[t], s, pos)
    if t == 7 then v = v ~= 0 end
    return v, next_pos
  elseif t == 8 then
    local len, p = string.unpack("<I8", s, pos)
    return s:sub(p, p + len - 1), p + len
  elseif t == 9 then
    local et, n, p = string.unpack("<I4I8", s, pos)
    if SCALAR_SIZE[et] then return nil, p + n * SCALAR_SIZE[et] end
    for _ = 1, n do
      local _, q = read_value(s, et, p)
      p = q
    end
    return nil, p
  end
  error("gguf: unknown value type " .. tostring(t))
end

-- gguf.open(path) -> { version, meta = { key = scalar or string }, meta_types = { key = GGUF value
-- type id }, keys = { keys in file order }, tensors = { name = { dims, type, data_pos } }, names }
function M.open(path)
  local s = require("helpers.files").read(path)
  assert(s:sub(1, 4) == "GGUF", "gguf: " .. path .. " is not a GGUF file")
  local version, n_tensors, n_kv, pos = string.unpack("<I4I8I8", s, 5)
  local meta, types, keys = {}, {}, {}
  for _ = 1, n_kv do
    local klen, p = string.unpack("<I8", s, pos)
    local key = s:sub(p, p + klen - 1)
    local t
    t, p = string.unpack("<I4", s, p + klen)
    meta[key], pos = read_value(s, t, p)
    types[key], keys[#keys + 1] = t, key
  end
  local tensors, order = {}, {}
  for _ = 1, n_tensors do
    local nlen, p = string.unpack("<I8", s, pos)
    local name = s:sub(p, p + nlen - 1)
    local n_dims
    n_dims, p = string.unpack("<I4", s, p + nlen)
    local dims = {}
    for d = 1, n_dims do dims[d], p = string.unpack("<I8", s, p) end
    local ttype, offset
    ttype, offset, pos = string.unpack("<I4I8", s, p)
    tensors[name] = { dims = dims, type = ttype, offset = offset }
    order[#order + 1] = name
  end
  local align = meta["general.alignment"] or 32
  local data_start = ((pos - 1 + align - 1) // align) * align + 1
  for _, t in pairs(tensors) do t.data_pos = data_start + t.offset end
  return setmetatable({ bytes = s, version = version, meta = meta, meta_types = types, keys = keys,
    tensors = tensors, names = order }, { __index = M })
end

local function f16_to_number(h)
  local sign = (h & 0x8000) ~= 0 and -1 or 1
  local e, m = (h >> 10) & 0x1f, h & 0x3ff
  if e == 0 then return sign * m * 2.0 ^ -24 end
  if e == 31 then return m == 0 and sign * math.huge or 0 / 0 end
  return sign * (1 + m / 1024) * 2.0 ^ (e - 15)
end

local function bf16_to_number(h) return (string.unpack("<f", string.pack("<I4", h << 16))) end

-- Row r (0-based) of tensor `name` as a list of numbers (f32: exact; f16/bf16: exact; q8_0:
-- d * q with d the block's f16 scale, rounded to f32 like the product ggml computes).
function M:row(name, r)
  local t = assert(self.tensors[name], "gguf: no tensor " .. name)
  local n, s, out = t.dims[1], self.bytes, {}
  if t.type == 0 then
    local pos = t.data_pos + r * n * 4
    for i = 1, n do out[i], pos = string.unpack("<f", s, pos) end
  elseif t.type == 1 or t.type == 30 then
    local pos = t.data_pos + r * n * 2
    for i = 1, n do
      local h
      h, pos = string.unpack("<I2", s, pos)
      out[i] = t.type == 1 and f16_to_number(h) or bf16_to_number(h)
    end
  elseif t.type == 8 then
    local pos = t.data_pos + r * (n // 32) * 34
    for b = 0, n // 32 - 1 do
      local h
      h, pos = string.unpack("<I2", s, pos)
      local d = f16_to_number(h)
      for j = 1, 32 do
        local q
        q, pos = string.unpack("b", s, pos)
        out[b * 32 + j] = string.unpack("<f", string.pack("<f", d * q))
      end
    end
  else
    error("gguf: tensor " .. name .. " has type " .. t.type .. ", which this reader does not decode")
  end
  return out
end

-- Number of rows (every dimension after the first).
function M:rows(name)
  local t = assert(self.tensors[name], "gguf: no tensor " .. name)
  local n = 1
  for d = 2, #t.dims do n = n * t.dims[d] end
  return n
end

return M
