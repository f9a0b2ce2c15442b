-- helpers.fnv — FNV-1a 64 of a string, written out in Lua: the independent expectation the
-- fingerprint specs compare ember's value fingerprints with (SPEC: FNV-1a 64 over the f32 bytes).

local M = {}

-- fnv1a64(s) -> the hash as a Lua integer (two's complement of the unsigned value)
function M.fnv1a64(s)
  local h = -3750763034362895579 -- the offset basis 0xcbf29ce484222325
  for i = 1, #s do
    h = h ~ s:byte(i)
    h = h * 0x100000001b3
  end
  return h
end

return M
