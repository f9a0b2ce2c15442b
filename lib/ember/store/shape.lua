-- ember.store.shape — the one element count of a shape read from a file or a manifest: every
-- dimension an integer >= 0, the product bounded before it is formed. Must not know what the
-- shape describes (the readers say that in their messages).
--
-- Lua integers wrap silently: 2^32 * 2^32 is 0, so a 128-byte file claiming a [2^32, 2^32] tensor
-- with no data matched "0 bytes needed". Every shape product of lib/ember goes through count().
-- The C side has its twin, ember_shape_count (src/kernels/types.h).

local M = {}

-- The largest tensor ember makes (as the bindings' EMBER_LUA_MAX_ELEMENTS): 2^32 values.
M.MAX_TENSOR_VALUES = 1 << 32

local function text(dims)
  local parts = {}
  for i, d in ipairs(dims) do parts[i] = math.type(d) == "integer" and string.format("%d", d) or tostring(d) end
  return "[" .. table.concat(parts, ", ") .. "]"
end
M.text = text

-- count(dims, max) -> n | nil, reason. dims: a list of integers >= 0; max: the largest product
-- accepted (default math.maxinteger). The reason reads after "shape ": "... [4294967296,
-- 4294967296] has more than 4294967296 values".
function M.count(dims, max)
  max = max or math.maxinteger
  if type(dims) ~= "table" then return nil, "is not a list of dimensions" end
  local empty = false -- a zero dimension makes the product 0, whatever the others
  for i, d in ipairs(dims) do
    if math.type(d) ~= "integer" or d < 0 then
      return nil, string.format("%s: dimension %d (%s) is not a non-negative integer", text(dims), i, tostring(d))
    end
    empty = empty or d == 0
  end
  local n = empty and 0 or 1
  if not empty then
    for _, d in ipairs(dims) do
      if n > max // d then return nil, string.format("%s has more than %d values", text(dims), max) end
      n = n * d -- n * d <= max: no wrap
    end
  end
  if n > max then return nil, string.format("%s has more than %d values", text(dims), max) end
  return n
end

-- check(dims, max, what) -> n, or raises "<what>: shape <reason>".
function M.check(dims, max, what)
  local n, why = M.count(dims, max)
  if not n then error(string.format("%s: shape %s", what, why), 0) end
  return n
end

return M
