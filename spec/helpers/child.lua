-- helpers.child — Lua code run in a child lua5.4 on this tree's library and core.so, so that a hang
-- (a FIFO opened for reading), a runaway read (/dev/zero) or a crash is the calling test's
-- failure, not the end of the busted run: a time limit (timeout(1)), an address-space limit
-- (ulimit -v) and, as root, optionally the permissions of nobody (setpriv), where permission bits
-- apply.

local M = {}

local function q(s) return "'" .. tostring(s):gsub("'", [['\'']]) .. "'" end

-- run(cmd) -> what the shell command printed (stdout; stderr as the command redirects it).
function M.run(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return out
end

M.ROOT = M.run("pwd"):gsub("\n$", "")
M.UID = tonumber(M.run("id -u"))

-- lua(cwd, code [, opts]) -> { the values the child passed to report(...) }, or nil and why it
-- did not report (its output, or that it was stopped). opts: unprivileged = true (as nobody when
-- this process is root), seconds = the time limit (60), memory_kb = the address-space limit
-- (4 GiB). The child's code sees `fs` (ember.store.fs) and `report`.
function M.lua(cwd, code, opts)
  opts = opts or {}
  local prefix = ""
  if opts.unprivileged and M.UID == 0 then
    if not os.execute("command -v setpriv >/dev/null 2>&1") then
      return nil, "running as root (id -u = 0), where permission bits do not apply, and setpriv(1) is missing"
    end
    prefix = "setpriv --reuid=65534 --regid=65534 --clear-groups "
  end
  local prelude = "local fs = require('ember.store.fs') local function report(...) local t = table.pack(...) "
    .. "local out = {} for i = 1, t.n do out[i] = string.format('%q', t[i]) end "
    .. "io.write('return ', table.concat(out, ', ')) end "
  local cmd = string.format("cd %s && ulimit -v %d && %senv LUA_PATH=%s LUA_CPATH=%s timeout %d lua5.4 -e %s 2>&1",
    q(cwd), opts.memory_kb or 4 * 1024 * 1024, prefix, q(M.ROOT .. "/lib/?.lua;" .. M.ROOT .. "/lib/?/init.lua;;"),
    q(M.ROOT .. "/build/lua/?.so;;"), opts.seconds or 60, q(prelude .. code))
  local out = M.run(cmd .. "; echo \"<exit $?>\"")
  local status = out:match("<exit (%d+)>\n?$")
  out = out:gsub("<exit %d+>\n?$", "")
  if status == "124" then return nil, "stopped after " .. (opts.seconds or 60) .. " s (it hung): " .. out end
  local chunk = out:sub(1, 7) == "return " and load(out)
  if not chunk then return nil, "the child did not report (exit " .. tostring(status) .. "): " .. out end
  return { chunk() }
end

return M
