-- ember.fs — the few file-system operations artifacts need: whole-file read, atomic write
-- (temporary file + rename), directories. Must not leave half-written outputs behind.
--
-- File tests (what a path is, what a directory holds) are system calls through ember.core
-- (src/lua_bindings/l_fs.c): they run per artifact and per output, and a /bin/sh each time made
-- them the cost of a read. Plain Lua has no mkdir/rmdir either; the few directory changes still go
-- through /bin/sh with every path single-quoted (no word splitting, no globbing, no injection).

local internal = require("ember.core").internal

local M = {}

function M.shell_quote(s)
  return "'" .. tostring(s):gsub("'", [['\'']]) .. "'"
end

local function sh(cmd)
  local ok = os.execute(cmd .. " 2>/dev/null")
  return ok == true
end

-- exists(path): anything is there (a symbolic link counts by what it points to, as with test -e).
function M.exists(path)
  return internal.stat(path) ~= nil
end

function M.is_dir(path)
  local info = internal.stat(path)
  return info ~= nil and info.type == "dir"
end

function M.dirname(path)
  local d = path:match("^(.*)/[^/]*$")
  if d == nil then return "." end
  if d == "" then return "/" end
  return d
end

function M.basename(path)
  return (path:gsub("/+$", ""):match("([^/]*)$"))
end

function M.join(a, b)
  if a:sub(-1) == "/" then return a .. b end
  return a .. "/" .. b
end

-- read(path, what) -> whole file as a string; raises "<what> 'path': reason" when unreadable.
function M.read(path, what)
  local f, err = io.open(path, "rb")
  if not f then error(string.format("%s: cannot open: %s", what or path, err), 0) end
  local data = f:read("a")
  f:close()
  if data == nil then error(string.format("%s: cannot read '%s'", what or path, path), 0) end
  return data
end

-- This process's id (from /proc/self/stat), or 0 where there is none: temporary names carry it,
-- so a later run can tell a killed writer's leftovers from a live writer's file.
local function own_pid()
  local f = io.open("/proc/self/stat", "r")
  local pid = f and f:read("n")
  if f then f:close() end
  return math.tointeger(pid) or 0
end
local PID = own_pid()

-- A name next to `path` that no one else uses: same directory, so rename() stays atomic.
-- NAME.tmp-PID-RANDOM (sweep_temps relies on the form).
function M.temp_sibling(path)
  return string.format("%s.tmp-%d-%08x%08x", path, PID, math.random(0, 0x7fffffff), os.time() & 0x7fffffff)
end

-- sweep_temps(dir) -> list of the paths removed: the temporary files and directories that an
-- atomic write in `dir` left behind when its process was killed (NAME.tmp-PID-RANDOM whose PID no
-- longer runs; the older NAME.tmp-RANDOM form once it is an hour old). A live writer's are kept.
function M.sweep_temps(dir)
  local removed = {}
  local names = internal.list_dir(dir)
  if not names then return removed end
  local hour_ago = os.time() - 3600
  for _, name in ipairs(names) do
    if name:find(".tmp-", 1, true) then
      local path = M.join(dir, name)
      local pid = name:match("%.tmp%-(%d+)%-%x+$")
      local dead
      if pid then
        pid = tonumber(pid)
        dead = pid ~= PID and pid > 0 and not M.exists("/proc/" .. pid)
      elseif name:match("%.tmp%-%x+$") then
        -- the older form carries no writer: only an hour without a change marks it abandoned
        local info = internal.stat(path, true)
        dead = info ~= nil and info.mtime < hour_ago
      end
      if dead and M.remove_tree(path) then removed[#removed + 1] = path end
    end
  end
  return removed
end

-- write_atomic(path, data [, what]) -> the stale temporaries swept from path's directory (see
-- sweep_temps). Readers see the old file or the whole new one, never a part.
function M.write_atomic(path, data, what)
  local swept = M.sweep_temps(M.dirname(path))
  local tmp = M.temp_sibling(path)
  local f, err = io.open(tmp, "wb")
  if not f then error(string.format("%s: cannot write '%s': %s", what or "output", path, err), 0) end
  local ok, werr = f:write(data)
  if ok then ok, werr = f:flush() end
  f:close()
  if not ok then
    os.remove(tmp)
    error(string.format("%s: cannot write '%s': %s", what or "output", path, tostring(werr)), 0)
  end
  local rok, rerr = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    error(string.format("%s: cannot move into place '%s': %s", what or "output", path, rerr), 0)
  end
  return swept
end

-- mkdir(path) -> true, or nil and a message (parent missing, already exists, permissions).
function M.mkdir(path)
  if M.exists(path) then return nil, "already exists" end
  if not sh("mkdir -- " .. M.shell_quote(path)) then return nil, "cannot create directory" end
  return true
end

function M.mkdir_p(path)
  if M.is_dir(path) then return true end
  if not sh("mkdir -p -- " .. M.shell_quote(path)) then return nil, "cannot create directory" end
  return true
end

-- Only ever called on directories this process created (temporary artifact directories) and on
-- the stale temporaries sweep_temps has found (a killed writer's).
function M.remove_tree(path)
  return sh("rm -rf -- " .. M.shell_quote(path))
end

-- A fresh private directory under $TMPDIR (or /tmp) for scratch outputs such as workflow runs.
function M.make_temp_dir(prefix)
  local base = os.getenv("TMPDIR") or "/tmp"
  for _ = 1, 16 do
    -- not the NAME.tmp-PID-RANDOM form: these directories outlive their process on purpose, and
    -- sweep_temps must never take them for a killed writer's leftovers
    local path = M.join(base, string.format("%s-%08x%08x", M.basename(prefix or "ember"), math.random(0, 0x7fffffff),
      os.time() & 0x7fffffff))
    if M.mkdir(path) then return path end
  end
  error("cannot create a temporary directory under " .. base, 0)
end

return M
