-- helpers.processes — whether Lua code starts a process: spawn_count(fn) runs fn with os.execute
-- and io.popen counted (each still runs) and returns how many times either was called; an error
-- in fn is raised again after both are restored.

local M = {}

function M.spawn_count(fn)
  local calls = 0
  local saved_execute, saved_popen = os.execute, io.popen
  os.execute = function(...) calls = calls + 1; return saved_execute(...) end
  io.popen = function(...) calls = calls + 1; return saved_popen(...) end
  local ok, err = pcall(fn)
  os.execute, io.popen = saved_execute, saved_popen
  if not ok then error(err, 0) end
  return calls
end

return M
