-- ember.store.vector_file — one vector from a file, for steering: a NumPy .npy file (read here: the
-- format is documented, a magic, a small Python-literal header and the raw values), a tensor of a
-- safetensors file, or a record of a captured artifact. Must not know where a vector is added.
--
-- Source grammar (docs/cli.md, --steer):
--   FILE.npy[@ROW]                      1-D (n,), or 2-D (r, n) with ROW when r > 1; '<f4' or '<f2'
--   FILE.safetensors[#NAME][@ROW]       NAME may be left out when the file holds one tensor
--   ARTIFACT_DIR#RECORD[@ROW]           RECORD: the record's tensor name or its 0-based index
-- ROW is 0-based; the result is always one row, an ember.Tensor [1, n].

local M = {}

local function core() return require("ember.core") end

-- The largest .npy read: a vector is hidden_size or n_ff values; a whole matrix is not one.
M.MAX_NPY_BYTES = 256 * 1024 * 1024
M.MAX_SAFETENSORS_BYTES = 4 * 1024 * 1024 * 1024

-- f16 bits -> number (IEEE half: 1 sign, 5 exponent, 10 mantissa bits); exact in a double.
local function f16_value(h)
  local sign = (h & 0x8000) ~= 0 and -1.0 or 1.0
  local e, m = (h >> 10) & 0x1f, h & 0x3ff
  if e == 0 then return sign * m * 2.0 ^ -24 end           -- zero and subnormals
  if e == 31 then return m == 0 and sign * math.huge or 0 / 0 end
  return sign * (1024 + m) * 2.0 ^ (e - 25)
end

M.f16_value = f16_value

-- parse_npy(bytes, what [, base [, len]]) -> { dtype = "<f4"|"<f2", shape = {...}, data_offset (1-based) }
-- The array is the len bytes of `bytes` from index base (default: all of it), so an entry of a
-- container (an .npz) is read in place. Versions 1.0 (u16 header length) and 2.0/3.0 (u32); the
-- header is a Python dict literal with the keys descr, fortran_order and shape. Only
-- little-endian f32/f16 in C order are read.
function M.parse_npy(s, what, base, len)
  base = base or 1
  len = len or #s - base + 1
  local last = base + len - 1
  if len < 10 or s:sub(base, base + 5) ~= "\147NUMPY" then error(what .. ": not a NumPy .npy file (bad magic)", 0) end
  local major = s:byte(base + 6)
  local hlen, pos
  if major == 1 then
    hlen, pos = string.unpack("<I2", s, base + 8)
  elseif major == 2 or major == 3 then
    if len < 12 then error(what .. ": truncated .npy header", 0) end
    hlen, pos = string.unpack("<I4", s, base + 8)
  else
    error(string.format("%s: unsupported .npy format version %d", what, major), 0)
  end
  if pos + hlen - 1 > last then error(what .. ": truncated .npy header", 0) end
  local header = s:sub(pos, pos + hlen - 1)
  if not header:match("^%s*{") then error(what .. ": .npy header is not a dictionary", 0) end
  local descr = header:match("['\"]descr['\"]%s*:%s*['\"]([^'\"]*)['\"]")
  local fortran = header:match("['\"]fortran_order['\"]%s*:%s*(%a+)")
  local shape_s = header:match("['\"]shape['\"]%s*:%s*%(([^)]*)%)")
  if descr == nil or fortran == nil or shape_s == nil then
    error(what .. ": .npy header lacks descr, fortran_order or shape", 0)
  end
  if descr ~= "<f4" and descr ~= "<f2" then
    error(string.format("%s: dtype '%s' is not read (little-endian float32 '<f4' or float16 '<f2' only)", what,
      descr), 0)
  end
  if fortran ~= "False" then error(what .. ": Fortran-order arrays are not read (save in C order)", 0) end
  local shape = {}
  for item in shape_s:gmatch("[^,]+") do
    local d = item:match("^%s*(%d+)%s*$")
    if not d then
      if item:match("%S") then error(string.format("%s: bad shape '(%s)' in the .npy header", what, shape_s), 0) end
    else
      local v = math.tointeger(tonumber(d))
      if not v then error(string.format("%s: dimension %s in shape (%s) is out of range", what, d, shape_s), 0) end
      shape[#shape + 1] = v
    end
  end
  if #shape < 1 or #shape > 2 then
    error(string.format("%s: shape (%s) is not a vector or a matrix (1 or 2 dimensions)", what, shape_s), 0)
  end
  for _, d in ipairs(shape) do
    if d < 1 then error(string.format("%s: shape (%s) is empty", what, shape_s), 0) end
  end
  local size = descr == "<f4" and 4 or 2
  local offset = pos + hlen
  -- bounded by the bytes the file holds, so no product can wrap (2^32 x 2^32 is not 0)
  local n = require("ember.store.shape").count(shape, (last - offset + 1) // size)
  if not n then
    error(string.format("%s: shape (%s) of %s needs more than the %d data bytes the file holds", what, shape_s,
      descr, last - offset + 1), 0)
  end
  if last - offset + 1 ~= n * size then
    error(string.format("%s: holds %d data bytes, shape (%s) of %s needs %d", what, last - offset + 1, shape_s,
      descr, n * size), 0)
  end
  return { dtype = descr, shape = shape, data_offset = offset, rows = #shape == 2 and shape[1] or 1,
    cols = shape[#shape] }
end

-- npy_tensor(bytes, what) -> ember.Tensor [rows, cols] of the file's values (f16 widened exactly).
function M.npy_tensor(s, what)
  local h = M.parse_npy(s, what)
  local n = h.rows * h.cols
  local bytes
  if h.dtype == "<f4" then
    bytes = s:sub(h.data_offset, h.data_offset + n * 4 - 1)
  else
    local parts = {}
    for i = 0, n - 1 do
      parts[i + 1] = string.pack("<f", f16_value(string.unpack("<I2", s, h.data_offset + 2 * i)))
    end
    bytes = table.concat(parts)
  end
  return core().tensor_from_bytes(bytes, h.rows, h.cols), h
end

-- split(source) -> path, name|nil, row|nil: "PATH[#NAME][@ROW]". A '#' or '@' inside PATH is kept
-- when what follows does not have the selector's form.
local function split(source)
  local path, row = source:match("^(.-)@(%d+)$")
  if not path then path = source end
  local base, name = path:match("^(.-)#([^#/]+)$")
  if base and base ~= "" then path = base else name = nil end
  return path, name, row and math.tointeger(tonumber(row))
end

local function pick_row(t, row, what)
  local rows = t:shape()[1]
  if row == nil then
    if rows ~= 1 then
      error(string.format("%s: holds %d rows; choose one with @ROW (0-%d)", what, rows, rows - 1), 0)
    end
    return t
  end
  if row >= rows then error(string.format("%s: row %d is out of range (0-%d)", what, row, rows - 1), 0) end
  return t:row(row + 1):clone()
end

-- read(source) -> { tensor = ember.Tensor [1, n], source = the text given, kind = "npy" |
-- "safetensors" | "artifact", sha256 = of the vector's little-endian f32 bytes, shape = {1, n} }.
-- Errors name the source and say what was expected.
function M.read(source)
  if type(source) ~= "string" or source == "" then error("vector file: a path is required", 0) end
  local fs = require("ember.store.fs")
  local path, name, row = split(source)
  local what = "vector '" .. source .. "'"
  local t, kind
  if fs.is_dir(path) then
    kind = "artifact"
    if not name then
      error(what .. ": an artifact directory needs a record: DIR#RECORD (its tensor name or index)", 0)
    end
    local art = require("ember.store.artifact").read(path)
    local rec
    local index = math.tointeger(tonumber(name))
    for _, r in ipairs(art.records) do
      if r.name == name or (index ~= nil and r.index == index) then rec = r end
    end
    if not rec then
      error(string.format("%s: artifact '%s' has no record '%s' (%d records: names like '%s', or 0-%d)", what,
        path, name, #art.records, art.records[1] and art.records[1].name or "-", #art.records - 1), 0)
    end
    t = rec.tensor
  elseif path:match("%.npy$") then
    kind = "npy"
    if name then error(what .. ": a .npy file holds one array; '#" .. name .. "' does not apply", 0) end
    t = M.npy_tensor(fs.read(path, what, M.MAX_NPY_BYTES), what)
  elseif path:match("%.safetensors$") then
    kind = "safetensors"
    -- through the regular-file gate (a FIFO or /dev/zero is an error, not a hang), then the
    -- container decoder every safetensors reader of ember uses
    local st = require("ember.store.safetensors").decode(fs.read(path, what, M.MAX_SAFETENSORS_BYTES), what)
    local tensors, names = {}, {}
    for _, n in ipairs(st.names) do
      local e = st.tensors[n]
      names[#names + 1] = n
      if e.dtype == "F32" and (#e.shape == 1 or #e.shape == 2) then
        local rows, cols = #e.shape == 2 and e.shape[1] or 1, e.shape[#e.shape]
        if rows >= 1 and cols >= 1 then tensors[n] = { rows = rows, cols = cols, data = e.data, dtype = e.dtype } end
      else
        tensors[n] = { bad = string.format("is %s of rank %d (a vector is F32, of rank 1 or 2)", e.dtype, #e.shape) }
      end
    end
    table.sort(names)
    if name == nil then
      if #names ~= 1 then
        error(string.format("%s: holds %d tensors (%s); choose one with FILE#NAME", what, #names,
          table.concat(names, ", ")), 0)
      end
      name = names[1]
    end
    local e = tensors[name]
    if not e then
      error(string.format("%s: no tensor '%s' (it holds %s)", what, name, table.concat(names, ", ")), 0)
    end
    if e.bad then error(string.format("%s: tensor '%s' %s", what, name, e.bad), 0) end
    t = core().tensor_from_bytes(e.data, e.rows, e.cols)
  else
    error(what .. ": expected a .npy file, a .safetensors file or an artifact directory DIR#RECORD"
      .. (fs.exists(path) and "" or " (and '" .. path .. "' does not exist)"), 0)
  end
  t = pick_row(t, row, what)
  return { tensor = t, source = source, kind = kind, sha256 = t:sha256(), shape = t:shape() }
end

return M
