-- ember.run.outputs — the output paths of one run, checked together before it starts: no two outputs
-- may name one file (or a file of the capture directory), a default path never replaces an existing
-- file, and every output's directory takes a new file. The one place that decides whether a run's
-- outputs collide or can be written.

local fs = require("ember.store.fs")

local M = {}

-- The files a capture artifact directory is made of (lib/ember/run/capture.lua writes them).
M.ARTIFACT_FILES = { "manifest.json", "tensors.safetensors" }

-- A path in one spelling: "./a//b/" -> "a/b"; the parent resolved through realpath when it exists,
-- so "x.json" and "./d/../x.json" are one file.
local function normal(path)
  local p = path:gsub("/+", "/"):gsub("(.)/$", "%1")
  while p:sub(1, 2) == "./" do p = p:sub(3) end
  local parent, base = fs.dirname(p), fs.basename(p)
  local real = fs.realpath(parent)
  if real then return (real == "/" and "" or real) .. "/" .. base end
  return p
end

-- check(list) -> nil | message. list: { { flag = "--name", path = P, kind = "file" | "dir",
-- default = true when the path was not given by the user }, ... } (entries without a path are
-- skipped). Refuses two entries naming one path, a file output that is one of a capture
-- directory's own files, and a default file path that already exists.
function M.check(list)
  local seen = {}
  for _, o in ipairs(list) do
    if o.path then
      local key = normal(o.path)
      local prev = seen[key]
      if prev then
        return string.format("%s and %s both name '%s': each output needs its own path", prev.flag, o.flag, o.path)
      end
      seen[key] = o
      if o.kind == "dir" then
        for _, f in ipairs(M.ARTIFACT_FILES) do seen[normal(fs.join(o.path, f))] = o end
      end
    end
  end
  for _, o in ipairs(list) do
    if o.path and o.default and o.kind == "file" and fs.exists(o.path) then
      return string.format("%s: the default '%s' already exists and would be overwritten (give %s FILE, or "
        .. "remove it)", o.flag, o.path, o.flag)
    end
  end
  return nil
end

-- writable(list) -> nil | message. list as for check (kind "dir" entries may name an existing
-- directory, which is then written into: a sweep's --out resumes there). The directory each output
-- goes into must take a new file: a temporary file is made there and removed (the honest test:
-- permission bits, ACLs, a read-only mount, a full quota all answer it), so an unwritable output
-- is found before the run, not after it. A directory that does not exist is left to the caller's
-- own message.
function M.writable(list)
  for _, o in ipairs(list) do
    if o.path then
      local path = (o.path:gsub("(.)/+$", "%1"))
      local dir = (o.kind == "dir" and fs.is_dir(path)) and path or fs.dirname(path)
      if fs.is_dir(dir) then
        local probe = fs.temp_sibling(fs.join(dir, ".write-check"))
        local f, err = io.open(probe, "wb")
        if not f then
          return string.format("%s: cannot write in directory '%s' (%s), so '%s' cannot be %s", o.flag, dir,
            tostring(err):match(": ([^:]+)$") or tostring(err), o.path, dir == path and "written" or "created")
        end
        f:close()
        os.remove(probe)
      end
    end
  end
  return nil
end

return M
