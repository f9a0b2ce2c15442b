-- ember.store.json — deterministic JSON text for artifacts, and decoding that keeps integers integers.
-- Must not hand-escape strings (cjson does that) nor lose digits of 64-bit integers.
--
-- Why not cjson.encode directly: it does not preserve key order (artifacts must be diffable byte
-- for byte), it prints numbers with 14 significant digits (a u64 fingerprint or a float32 value
-- would be rounded), and its decoder turns every number into a float.

local cjson = require("cjson")

local M = {}

M.null = cjson.null

-- Marks a Lua integer to be written as an unsigned 64-bit number (fingerprints are u64 bit
-- patterns; Lua integers are signed, so values >= 2^63 arrive negative).
local U64 = {}
U64.__index = U64
function M.u64(n)
  assert(math.type(n) == "integer", "json.u64 expects an integer")
  return setmetatable({ value = n }, U64)
end

-- Marks a table as a JSON array even when empty (an empty Lua table is otherwise an object).
local ARRAY = {}
function M.array(t)
  return setmetatable(t or {}, ARRAY)
end

-- Gives an object an explicit key order; keys not listed follow in sorted order.
function M.ordered(keys, t)
  return setmetatable(t, { ordered_keys = keys })
end

local function key_order(t)
  local mt = getmetatable(t)
  local listed = mt and mt.ordered_keys or {}
  local seen, keys = {}, {}
  for _, k in ipairs(listed) do
    if t[k] ~= nil then keys[#keys + 1] = k end
    seen[k] = true
  end
  local rest = {}
  for k in pairs(t) do
    if type(k) ~= "string" then
      error("json: object key must be a string, got " .. type(k) .. " (" .. tostring(k) .. ")", 0)
    end
    if not seen[k] then rest[#rest + 1] = k end
  end
  table.sort(rest)
  for _, k in ipairs(rest) do keys[#keys + 1] = k end
  return keys
end

local function is_array(t)
  if getmetatable(t) == ARRAY then return true end
  local n = #t
  if n == 0 then return false end
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

-- Shortest decimal that reads back to exactly the same double, so values round-trip and the
-- text is still readable (0.1, not 0.10000000000000001).
function M.format_float(x)
  if x ~= x then return '"NaN"' end
  if x == math.huge then return '"Infinity"' end
  if x == -math.huge then return '"-Infinity"' end
  for digits = 15, 17 do
    local s = string.format("%." .. digits .. "g", x)
    if tonumber(s) == x then
      -- keep a float recognisable as such in the text
      if not s:find("[%.eEn]") then s = s .. ".0" end
      return s
    end
  end
  error("json: unreachable: %.17g always round-trips", 0)
end

-- A JSON string literal. cjson escapes '/' as '\/' (legal, but paths become unreadable); undo
-- exactly that escape, pairwise from the left so that an escaped backslash is never split.
function M.string(s)
  return (cjson.encode(s):gsub("\\(.)", function(c)
    if c == "/" then return "/" end
  end))
end

local encode

local function encode_value(v, indent, level, out)
  local tv = type(v)
  if v == nil or v == cjson.null then
    out[#out + 1] = "null"
  elseif tv == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif tv == "string" then
    out[#out + 1] = M.string(v)
  elseif tv == "number" then
    if math.type(v) == "integer" then
      out[#out + 1] = string.format("%d", v)
    else
      out[#out + 1] = M.format_float(v)
    end
  elseif tv == "table" and getmetatable(v) == U64 then
    out[#out + 1] = string.format("%u", v.value)
  elseif tv == "table" then
    encode(v, indent, level, out)
  else
    error("json: cannot encode a " .. tv, 0)
  end
end

encode = function(t, indent, level, out)
  local nl, pad, pad_in, sep
  if indent then
    nl = "\n"
    pad = string.rep(indent, level)
    pad_in = string.rep(indent, level + 1)
    sep = ": "
  else
    nl, pad, pad_in, sep = "", "", "", ":"
  end
  if is_array(t) then
    if #t == 0 then out[#out + 1] = "[]"; return end
    -- arrays of scalars stay on one line: token ids and shapes read better that way
    local flat = true
    for i = 1, #t do
      if type(t[i]) == "table" and getmetatable(t[i]) ~= U64 then flat = false; break end
    end
    out[#out + 1] = "["
    for i = 1, #t do
      if i > 1 then out[#out + 1] = flat and (indent and ", " or ",") or "," end
      if not flat then out[#out + 1] = nl .. pad_in end
      encode_value(t[i], indent, level + 1, out)
    end
    out[#out + 1] = flat and "]" or (nl .. pad .. "]")
    return
  end
  local keys = key_order(t)
  if #keys == 0 then out[#out + 1] = "{}"; return end
  out[#out + 1] = "{"
  for i, k in ipairs(keys) do
    if i > 1 then out[#out + 1] = "," end
    out[#out + 1] = nl .. pad_in .. M.string(k) .. sep
    encode_value(t[k], indent, level + 1, out)
  end
  out[#out + 1] = nl .. pad .. "}"
end

-- encode(value [, {indent = "  "}]) -> JSON text. Objects: listed keys first (json.ordered),
-- then the others sorted; so the same data always gives the same bytes.
function M.encode(v, opts)
  local indent = opts and opts.indent
  local out = {}
  encode_value(v, indent, 0, out)
  if indent then out[#out + 1] = "\n" end
  return table.concat(out)
end

-- decode(text, what) -> value; raises "<what>: invalid JSON: ..." on bad input.
-- Numbers that are whole and fit exactly come back as Lua integers (cjson gives floats).
local function integerize(v)
  if type(v) == "number" then
    return math.tointeger(v) or v
  elseif type(v) == "table" then
    for k, x in pairs(v) do v[k] = integerize(x) end
  end
  return v
end

function M.decode(text, what)
  local ok, v = pcall(cjson.decode, text)
  if not ok then
    error(string.format("%s: invalid JSON: %s", what or "json", tostring(v)), 0)
  end
  return integerize(v)
end

return M
