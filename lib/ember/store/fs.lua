-- ember.store.fs — the few file-system operations artifacts need: whole-file read, atomic write
-- (temporary file + rename), directories. Must not leave half-written outputs behind.
--
-- Every file-system operation here is a system call through ember.core (src/lua_bindings/l_fs.c):
-- file tests, listing, mkdir, mkdir -p, recursive removal, realpath; renames are os.rename. No
-- process is started, so a path may hold any byte but NUL, and a failure says which path and why
-- (the OS reason, "Permission denied", "File exists"). There is no plain-Lua fallback: plain Lua
-- has no mkdir or stat, and ember.core is there wherever lib/ember runs (ember-lua, or stock
-- lua5.4 with build/lua/ember/core.so).

local internal = require("ember.core").internal

local M = {}

-- shell_quote(s) -> s in single quotes for /bin/sh, for the callers that do run external tools
-- (gnuplot, sbatch, job scripts); fs itself never needs it.
function M.shell_quote(s)
  return "'" .. tostring(s):gsub("'", [['\'']]) .. "'"
end

-- exists(path): anything is there (a symbolic link counts by what it points to, as with test -e).
function M.exists(path)
  return internal.stat(path) ~= nil
end

-- list_dir(path) -> the names in a directory (unsorted, no "." or ".."), {} when it cannot be read.
function M.list_dir(path)
  return internal.list_dir(path) or {}
end

-- size(path) -> the size in bytes of what is at path (links followed), or nil when nothing is.
function M.size(path)
  local info = internal.stat(path)
  return info and info.size
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

-- read(path, what, max_bytes) -> the whole file as a string: the one way lib/ember reads a file.
-- Through the regular-file gate (core.read_file, src/engine/file.c): a FIFO, a device or a
-- directory is refused naming it (opened without blocking: no hang on a FIFO), and so is a file
-- larger than max_bytes, the bound of its kind that every caller gives (no endless read of
-- /dev/zero). Raises "<what>: PATH: reason".
function M.read(path, what, max_bytes)
  assert(math.type(max_bytes) == "integer" and max_bytes >= 0, "fs.read: a size bound is required")
  local data, why = require("ember.core").read_file(path, max_bytes)
  if data == nil then error(string.format("%s: %s", what or path, why), 0) end
  return data
end

-- read_system(path, max_bytes) -> text of a kernel file (/proc, /sys: their size reads as 0, so the
-- gate above would return nothing), at most max_bytes, or nil. Only for the system's own files
-- named here, never for a path a user gives.
function M.read_system(path, max_bytes)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read(max_bytes)
  f:close()
  return text
end

-- Temporaries: NAME.ember-tmp-BOOT-PIDNS-PID-RANDOM, BOOT the first 16 hex digits of this boot's
-- id (another machine, or this one after a reboot, has another), PIDNS the inode of this process's
-- PID namespace (a container has another, where the same pid is someone else). The rule has one
-- owner, src/engine/temp_name.c (the engine's own writers follow it too): the mark is ember's
-- alone, so a user's own "keep.tmp-99999-cafe/" never looks like one, and "0" stands where the
-- identity cannot be read, so such temporaries are never swept.
M.TEMP_MARK = internal.temp_mark()

-- A name next to `path` that no one else uses: same directory, so rename() stays atomic.
M.temp_sibling = internal.temp_sibling

-- temp_writer_dead(name) -> whether `name` is an ember temporary whose writer provably no longer
-- runs: written on this boot of this machine, in this PID namespace, by a process that is gone.
-- Anything else (another node of a shared file system, another container, a live writer, a name
-- of another form) is not.
M.temp_writer_dead = internal.temp_writer_dead

-- sweep_temps(dir) -> list of the paths removed: the temporary files and directories that an
-- atomic write in `dir` left behind when its process was killed (temp_writer_dead). Only ember's
-- own temporaries, and only provably dead ones, are touched.
function M.sweep_temps(dir)
  local removed = {}
  local names = internal.list_dir(dir)
  if not names then return removed end
  for _, name in ipairs(names) do
    if name:find(M.TEMP_MARK, 1, true) and M.temp_writer_dead(name) then
      local path = M.join(dir, name)
      if M.remove_tree(path) then removed[#removed + 1] = path end
    end
  end
  return removed
end

-- temp_dir_beside(path, what) -> a new empty directory beside `path` (temp_sibling) that becomes
-- `path` by a rename, after the stale temporaries of its directory are swept; raises
-- "<what>: cannot create directory ..." when it cannot be made.
function M.temp_dir_beside(path, what)
  M.sweep_temps(M.dirname(path))
  local tmp = M.temp_sibling(path)
  local ok, err = M.mkdir(tmp)
  if not ok then error(string.format("%s: %s", what or "output", err), 0) end
  return tmp
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

-- mkdir(path [, mode]) -> true, or nil and "cannot create directory 'PATH': reason" (the OS
-- reason: "File exists" for anything already there, "No such file or directory" for a missing
-- parent, "Permission denied", "Not a directory"). mode: 0777 by default (less the umask).
M.mkdir = internal.mkdir

-- isatty(fd) -> whether the file descriptor (0 stdin, 1 stdout, 2 stderr) is a terminal.
M.isatty = internal.isatty

-- mkdir_p(path) -> true (also when the directory is there already), or nil and "cannot create
-- directory 'PREFIX': reason" naming the first component that could not be made.
M.mkdir_p = internal.mkdir_p

-- remove_tree(path) -> true (also when nothing is there), or nil and "cannot remove 'ENTRY':
-- reason". Never follows a symbolic link: a link inside the tree (or path itself) is removed, its
-- target is not; "", "/" and paths ending in "." or ".." are refused. Only ever called on
-- directories this process created (temporary artifact directories) and on the stale temporaries
-- sweep_temps has found (a killed writer's).
M.remove_tree = internal.remove_tree

-- realpath(path) -> the absolute path with links, "." and ".." resolved (every component must
-- exist), or nil and "cannot resolve 'PATH': reason".
M.realpath = internal.realpath

-- A fresh private directory under $TMPDIR (or /tmp) for scratch outputs such as workflow runs.
function M.make_temp_dir(prefix)
  local base = os.getenv("TMPDIR") or "/tmp"
  local last
  for _ = 1, 16 do
    -- without TEMP_MARK: these directories outlive their process on purpose, and sweep_temps
    -- must never take them for a killed writer's leftovers
    local path = M.join(base, string.format("%s-%08x%08x", M.basename(prefix or "ember"), math.random(0, 0x7fffffff),
      os.time() & 0x7fffffff))
    local ok, err = M.mkdir(path, 448) -- 0700: private, as the name promises
    if ok then return path end
    last = err
  end
  error("cannot create a temporary directory under " .. base .. ": " .. last, 0)
end

return M
