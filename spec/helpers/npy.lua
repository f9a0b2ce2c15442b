-- helpers.npy — a small reader for NumPy .npy files (format 1.0/2.0/3.0, little-endian '<f4',
-- C order), enough for the parity fixtures. Decodes values with string.unpack, independent of
-- ember's own tensor code, so the specs do not check ember with ember.

local M = {}

local function fail(path, msg) error("npy: " .. path .. ": " .. msg, 3) end

local function parse(s, path)
  if s:sub(1, 6) ~= "\147NUMPY" then fail(path, "not an .npy file (bad magic)") end
  local major = s:byte(7)
  local hlen, pos
  if major == 1 then
    hlen, pos = string.unpack("<I2", s, 9)
  elseif major == 2 or major == 3 then
    hlen, pos = string.unpack("<I4", s, 9)
  else
    fail(path, "unsupported format version " .. tostring(major))
  end
  local header = s:sub(pos, pos + hlen - 1)
  local descr = header:match("'descr'%s*:%s*'([^']*)'")
  local fortran = header:match("'fortran_order'%s*:%s*(%a+)")
  local shape_s = header:match("'shape'%s*:%s*%(([^)]*)%)")
  if descr ~= "<f4" then fail(path, "dtype " .. tostring(descr) .. " is not little-endian float32") end
  if fortran ~= "False" then fail(path, "Fortran order is not supported") end
  if not shape_s then fail(path, "no shape in header") end
  local shape = {}
  for d in shape_s:gmatch("%d+") do shape[#shape + 1] = tonumber(d) end
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  local offset = pos + hlen
  if #s - offset + 1 ~= n * 4 then
    fail(path, string.format("has %d data bytes, shape needs %d", #s - offset + 1, n * 4))
  end
  local t = { shape = shape, dtype = descr, rows = shape[1], cols = shape[2] or 1, data = s, offset = offset }
  return setmetatable(t, { __index = M })
end

local function slurp(path)
  local s = require("helpers.files").read_if_exists(path)
  if not s then error("npy: " .. path .. ": cannot be opened", 3) end
  return s
end

-- npy.read(path) -> { shape = {d1, d2, ...}, dtype = "<f4", rows = d1, cols = d2, data = bytes,
--                     offset = first data byte (1-based) }
function M.read(path) return parse(slurp(path), path) end

-- half(x) -> the IEEE f16 bits of x, for values a half holds exactly (normal numbers and zero:
-- what the specs write); anything else raises, so a spec never writes a rounded value unknowingly.
local function half(x)
  if x == 0 then return 0 end
  local sign = x < 0 and 0x8000 or 0
  local m, e = math.abs(x), 0
  while m >= 2 do m = m / 2; e = e + 1 end
  while m < 1 do m = m * 2; e = e - 1 end
  local frac = (m - 1) * 1024
  assert(e >= -14 and e <= 15 and frac == math.floor(frac), "npy.write: " .. x .. " is not exact in f16")
  return sign | ((e + 15) << 10) | math.tointeger(frac)
end

-- npy.write(path, values, shape [, dtype]) -> path: a version 1.0 .npy file of little-endian
-- float32 ('<f4', default) or float16 ('<f2') values in C order, written as NumPy's np.save does
-- (header padded with blanks to a multiple of 64 bytes, ending in a newline).
function M.write(path, values, shape, dtype)
  dtype = dtype or "<f4"
  local dims = {}
  for i, d in ipairs(shape) do dims[i] = tostring(d) end
  local shape_s = #dims == 1 and ("(" .. dims[1] .. ",)") or ("(" .. table.concat(dims, ", ") .. ")")
  local header = string.format("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", dtype, shape_s)
  header = header .. string.rep(" ", 63 - (10 + #header) % 64) .. "\n"
  local parts = {}
  for i, v in ipairs(values) do
    parts[i] = dtype == "<f4" and string.pack("<f", v) or string.pack("<I2", half(v))
  end
  local f = assert(io.open(path, "wb"))
  f:write("\147NUMPY\1\0", string.pack("<I2", #header), header, table.concat(parts))
  f:close()
  return path
end

-- Debian's lua-zlib (run.sh DEPS) inflates the entries np.savez_compressed writes; without it only
-- stored entries can be read, and M.zlib_missing says why.
local has_zlib, zlib = pcall(require, "zlib")
M.zlib_missing = not has_zlib and "the Lua module 'zlib' is not installed (Debian package lua-zlib)" or nil

-- ZIP method 8: raw deflate (no zlib header), hence the negative window size.
local function inflate(data, usize, where)
  if not has_zlib then fail(where, "is compressed and " .. M.zlib_missing) end
  local out, eof = zlib.inflate(-15)(data)
  if not eof or #out ~= usize then fail(where, "inflates to " .. #out .. " bytes, the ZIP entry says " .. usize) end
  return out
end

-- npy.read_npz(path) -> { [name without ".npy"] = array }: an .npz is a ZIP of .npy files, stored
-- (np.savez) or deflated (np.savez_compressed), found via the central directory.
function M.read_npz(path)
  local z = slurp(path)
  local eocd
  for i = #z - 21, math.max(1, #z - 65557), -1 do
    if z:sub(i, i + 3) == "PK\5\6" then eocd = i break end
  end
  if not eocd then fail(path, "no ZIP end-of-central-directory record") end
  local n_entries, _, cd_offset = string.unpack("<I2I4I4", z, eocd + 10)
  local out, pos = {}, cd_offset + 1
  for _ = 1, n_entries do
    if z:sub(pos, pos + 3) ~= "PK\1\2" then fail(path, "bad ZIP central directory entry") end
    local method = string.unpack("<I2", z, pos + 10)
    local csize, usize, nlen, xlen, clen = string.unpack("<I4I4I2I2I2", z, pos + 20)
    local local_off = string.unpack("<I4", z, pos + 42)
    local name = z:sub(pos + 46, pos + 46 + nlen - 1)
    if method ~= 0 and method ~= 8 then
      fail(path, name .. " uses ZIP method " .. method .. " (stored or deflate only)")
    end
    if csize == 0xFFFFFFFF or usize == 0xFFFFFFFF or local_off == 0xFFFFFFFF then
      fail(path, name .. " needs ZIP64, not supported")
    end
    if method == 0 then assert(csize == usize) end
    local lp = local_off + 1
    local lnlen, lxlen = string.unpack("<I2I2", z, lp + 26)
    local data_start = lp + 30 + lnlen + lxlen
    local bytes = z:sub(data_start, data_start + csize - 1)
    if method == 8 then bytes = inflate(bytes, usize, path .. ":" .. name) end
    out[(name:gsub("%.npy$", ""))] = parse(bytes, path .. ":" .. name)
    pos = pos + 46 + nlen + xlen + clen
  end
  return out
end

-- The raw little-endian bytes of row i (1-based) of a 2-D array.
function M.row_bytes(a, i)
  assert(i >= 1 and i <= a.rows, "npy: row out of range")
  local start = a.offset + (i - 1) * a.cols * 4
  return a.data:sub(start, start + a.cols * 4 - 1)
end

-- Row i (1-based) as a Lua array of numbers, decoded with string.unpack in chunks.
function M.row(a, i)
  assert(i >= 1 and i <= a.rows, "npy: row out of range")
  local out, pos, left = {}, a.offset + (i - 1) * a.cols * 4, a.cols
  while left > 0 do
    local k = math.min(left, 4096)
    local vals = table.pack(string.unpack("<" .. string.rep("f", k), a.data, pos))
    for j = 1, k do out[#out + 1] = vals[j] end
    pos = vals[k + 1]
    left = left - k
  end
  return out
end

return M
