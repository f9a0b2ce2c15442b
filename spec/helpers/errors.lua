-- helpers.errors — the error a call raises, as a string, for specs that check messages; a call
-- that does not raise fails the spec there (a refusal that silently passes is the bug looked for).

local M = {}

-- error_of(f, ...) -> tostring of the error f(...) raised
function M.error_of(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

return M
