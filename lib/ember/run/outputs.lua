-- ember.run.outputs — the output paths of one run, checked together before it starts: no two outputs
-- may name one file (or a file of the capture directory), and a default path never replaces an
-- existing file. The one place that decides whether a run's outputs collide.

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

return M
