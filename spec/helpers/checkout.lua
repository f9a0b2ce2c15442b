-- helpers.checkout — a clean checkout of the current tree in a temporary directory (every tracked
-- file as it is in the working tree, committed to a fresh git repository), with the built
-- binaries linked into its build/, so a spec can run documented commands verbatim there and
-- then ask git whether they left anything behind. Must not touch the real tree.

local fs = require("ember.store.fs")
local fx = require("helpers.fixtures")

local M = {}

local q = fs.shell_quote

local function sh(cmd)
  local p = io.popen("(" .. cmd .. ") 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok == true, out, code
end
M.sh = sh

-- What a documented command may use from build/ (linked, not copied: no rebuild); lua/ holds
-- the core module stock lua5.4 loads.
local BINARIES = { "ember-lua", "ember", "make-tiny-model", "bench-engine", "lua" }

-- make() -> root of the copy, or nil and the reason. The copy's build/ holds links to the real
-- build's binaries; it is ignored by the tree's .gitignore, as a real build/ is.
function M.make()
  local build = fx.build
  if not fx.exists(build .. "/ember-lua") then return nil, "missing " .. build .. "/ember-lua (build first)" end
  local ok, top = sh("git rev-parse --show-toplevel")
  if not ok then return nil, "not a git checkout: " .. top end
  top = top:gsub("%s+$", "")
  local root = fs.make_temp_dir("ember-checkout")
  local steps = {
    -- tracked files as they are now (uncommitted edits included), deleted ones left out
    "cd " .. q(top)
      .. " && git ls-files -z | xargs -0 sh -c 'for f; do [ -e \"$f\" ] && printf \"%s\\0\" \"$f\"; done' sh"
      .. " | tar --null -T - -cf - | tar -C " .. q(root) .. " -xf -",
    "cd " .. q(root) .. " && git init -q && git add -A && git -c user.name=spec -c user.email=spec@localhost "
      .. "commit -q -m checkout",
    "mkdir -p " .. q(root .. "/build"),
  }
  for _, cmd in ipairs(steps) do
    local okc, out = sh(cmd)
    if not okc then
      fs.remove_tree(root)
      return nil, "cannot make the checkout (" .. cmd .. "): " .. out
    end
  end
  local abs_build = build:sub(1, 1) == "/" and build or (top .. "/" .. build)
  for _, b in ipairs(BINARIES) do
    if fx.exists(abs_build .. "/" .. b) then
      sh("ln -s " .. q(abs_build .. "/" .. b) .. " " .. q(root .. "/build/" .. b))
    end
  end
  return root
end

-- status(root) -> `git status --porcelain --ignored=no` of the copy ("" when clean).
function M.status(root)
  local _, out = sh("cd " .. q(root) .. " && git status --porcelain")
  return out
end

function M.remove(root) fs.remove_tree(root) end

return M
