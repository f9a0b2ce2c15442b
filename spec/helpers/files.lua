-- helpers.files — the one way the specs read a whole file: read(path) raises naming the file,
-- read_if_exists(path) gives nil for a missing one (an optional fixture makes a spec pending).

local M = {}

-- read(path) -> the file's bytes; raises "path: reason" when it cannot be opened.
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then error(err, 2) end
  local s = f:read("a")
  f:close()
  return s
end

-- read_if_exists(path) -> the file's bytes, or nil when it cannot be opened.
function M.read_if_exists(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

return M
