-- ember.store.npz — NumPy's .npz container (np.savez, np.savez_compressed): a ZIP archive of .npy
-- files, found through its central directory. Stored entries are read in place (no copy of their bytes);
-- deflated ones are inflated with Debian's lua-zlib when it is installed. Must not interpret the
-- arrays (vector_file.parse_npy reads each entry's header; the caller decides what they mean).
--
-- Layout (PKWARE APPNOTE 6.3): local headers + data, then the central directory (one 46-byte record
-- per entry + name + extra + comment), then the end-of-central-directory record (22 bytes + a
-- comment); archives over 4 GiB or 65535 entries mark the 32/16-bit fields 0xFFFF(FFFF) and keep
-- the real values in the ZIP64 end record and in each entry's extra field 0x0001.

local parse_npy = require("ember.store.vector_file").parse_npy

local M = {}

local function fail(what, msg, ...) error(string.format("%s: " .. msg, what, ...), 0) end

-- The end-of-central-directory record, searched backwards (its comment is at most 65535 bytes).
local function find_eocd(z, what)
  for i = #z - 21, math.max(1, #z - 65557), -1 do
    if z:byte(i) == 0x50 and z:sub(i, i + 3) == "PK\5\6" then return i end
  end
  fail(what, "not a ZIP archive (no end-of-central-directory record)")
end

-- Entry count and central-directory offset (0-based), through the ZIP64 end record when marked.
local function directory(z, what)
  local eocd = find_eocd(z, what)
  local n, _, cd = string.unpack("<I2I4I4", z, eocd + 10)
  if n == 0xFFFF or cd == 0xFFFFFFFF then
    local loc = eocd - 20
    if loc < 1 or z:sub(loc, loc + 3) ~= "PK\6\7" then fail(what, "ZIP64 archive without its locator") end
    local rec = string.unpack("<I8", z, loc + 8) + 1
    if rec < 1 or rec + 56 > #z or z:sub(rec, rec + 3) ~= "PK\6\6" then fail(what, "bad ZIP64 end record") end
    n, _, cd = string.unpack("<I8I8I8", z, rec + 24)
  end
  return n, cd
end

-- The ZIP64 extra field (id 1) of an entry: the marked sizes and offset, in their fixed order.
local function zip64_fields(z, pos, len, usize, csize, off, what)
  local stop = pos + len
  while pos + 4 <= stop do
    local id, size = string.unpack("<I2I2", z, pos)
    if id == 1 then
      local p = pos + 4
      local function take()
        local v = string.unpack("<I8", z, p)
        p = p + 8
        return v
      end
      if usize == 0xFFFFFFFF then usize = take() end
      if csize == 0xFFFFFFFF then csize = take() end
      if off == 0xFFFFFFFF then off = take() end
      return usize, csize, off
    end
    pos = pos + 4 + size
  end
  fail(what, "an entry is marked ZIP64 but has no ZIP64 extra field")
end

local has_zlib, zlib = pcall(require, "zlib")

local function inflate(bytes, usize, what)
  if not has_zlib then
    fail(what, "is deflate-compressed (np.savez_compressed) and the Lua module 'zlib' is not installed "
      .. "(Debian package lua-zlib); save it with np.savez")
  end
  local out, eof = zlib.inflate(-15)(bytes) -- raw deflate: no zlib header
  if not eof or #out ~= usize then fail(what, "inflates to %d bytes, the ZIP entry says %d", #out, usize) end
  return out
end

-- read(z, what) -> { names = { "W_enc", ... } (archive order), arrays = { [name] = array } }: z is
-- the whole file; each array is vector_file.parse_npy's header plus `bytes` (the string holding its
-- data: z itself for a stored entry) and its name without ".npy".
function M.read(z, what)
  local n, cd = directory(z, what)
  local out, pos = { names = {}, arrays = {} }, cd + 1
  for _ = 1, n do
    if pos + 45 > #z or z:sub(pos, pos + 3) ~= "PK\1\2" then fail(what, "bad ZIP central directory entry") end
    local flags, method = string.unpack("<I2I2", z, pos + 8)
    local csize, usize, nlen, xlen, clen = string.unpack("<I4I4I2I2I2", z, pos + 20)
    local off = string.unpack("<I4", z, pos + 42)
    local name = z:sub(pos + 46, pos + 45 + nlen)
    if usize == 0xFFFFFFFF or csize == 0xFFFFFFFF or off == 0xFFFFFFFF then
      usize, csize, off = zip64_fields(z, pos + 46 + nlen, xlen, usize, csize, off, what)
    end
    local where = what .. ":" .. name
    if flags & 1 ~= 0 then fail(where, "is encrypted") end
    if method ~= 0 and method ~= 8 then fail(where, "uses ZIP method %d (stored or deflate only)", method) end
    local lp = off + 1
    if lp + 29 > #z or z:sub(lp, lp + 3) ~= "PK\3\4" then fail(where, "bad ZIP local header") end
    local lnlen, lxlen = string.unpack("<I2I2", z, lp + 26)
    local first = lp + 30 + lnlen + lxlen
    if first + csize - 1 > #z then fail(where, "runs past the end of the file") end
    local bytes, base, len = z, first, csize
    if method == 8 then
      bytes = inflate(z:sub(first, first + csize - 1), usize, where)
      base, len = 1, #bytes
    elseif csize ~= usize then
      fail(where, "is stored with %d bytes but says %d", csize, usize)
    end
    local key = name:gsub("%.npy$", "")
    if out.arrays[key] then fail(what, "holds '%s' twice", key) end
    local a = parse_npy(bytes, where, base, len)
    a.bytes = bytes
    out.arrays[key] = a
    out.names[#out.names + 1] = key
    pos = pos + 46 + nlen + xlen + clen
  end
  return out
end

return M
