-- tests/check_requires.lua, the require-graph guard of the Lua library: the clean tree passes, and
-- each kind of violation injected into a scratch copy of lib/ fails, naming the file and the arrow.
-- Run by the built ember-lua (the interpreter ctest runs it with).

local F = require("helpers.fixtures")
local H = require("helpers.artifacts")

local lua_bin = F.build .. "/ember-lua"

-- check(dir) -> output, exit code of the guard over dir (a copy of lib/)
local function check(dir)
  local p = io.popen(H.shell_quote(lua_bin) .. " tests/check_requires.lua " .. H.shell_quote(dir)
    .. " 2>&1; echo \"rc=$?\"")
  local text = p:read("a")
  p:close()
  return text:gsub("rc=%d+\n$", ""), tonumber(text:match("rc=(%d+)\n$"))
end

-- scratch() -> a fresh copy of lib/ to break
local function scratch()
  local dir = H.tmpdir()
  assert(os.execute("cp -R lib/. " .. H.shell_quote(dir)))
  return dir
end

-- inject(dir, rel, line): line added before the module's final `return M`
local function inject(dir, rel, line)
  local path = dir .. "/" .. rel
  local text = H.read(path)
  local at = text:find("\nreturn M%s*$")
  assert(at, rel .. " does not end in `return M`")
  H.write(path, text:sub(1, at) .. line .. "\n" .. text:sub(at + 1))
end

describe("check_requires", function()
  before_each(function()
    if not F.exists(lua_bin) then pending("missing " .. lua_bin .. " (build the project first)") end
  end)
  after_each(H.cleanup)

  it("passes the tree as it is", function()
    if not F.exists(lua_bin) then return end
    local out, rc = check("lib")
    assert.equal(0, rc, out)
    assert.matches("requires hold: %d+ modules", out)
  end)

  it("fails a library module that requires the facade, also inside a function", function()
    if not F.exists(lua_bin) then return end
    local dir = scratch()
    inject(dir, "ember/store/json.lua", "function M.injected() return require(\"ember\").version end")
    local out, rc = check(dir)
    assert.equal(1, rc, out)
    assert.matches("ember/store/json.lua:%d+: ember.store.json requires ember: a library module needs only", out)
  end)

  it("fails a library module that requires a front-end", function()
    if not F.exists(lua_bin) then return end
    local dir = scratch()
    inject(dir, "ember/run/capture.lua", "local injected = require 'ember.cli.flags'")
    local out, rc = check(dir)
    assert.equal(1, rc, out)
    assert.matches("ember.run.capture requires ember.cli.flags: a library module never requires a front%-end", out)
  end)

  it("fails a require cycle and names its members", function()
    if not F.exists(lua_bin) then return end
    local dir = scratch()
    -- ember.sweep.store requires ember.store.json; the way back closes a cycle
    inject(dir, "ember/store/json.lua", "function M.injected() return pcall(require, \"ember.sweep.store\") end")
    local out, rc = check(dir)
    assert.equal(1, rc, out)
    assert.matches("require cycle of %d+ module%(s%): [^\n]*ember.store.json[^\n]*ember.sweep.store", out)
  end)

  it("fails a built name that reaches a cycle", function()
    if not F.exists(lua_bin) then return end
    local dir = scratch()
    inject(dir, "ember/store/fs.lua", "function M.injected(n) return require(\"ember.run.\" .. n) end")
    local out, rc = check(dir)
    assert.equal(1, rc, out)
    assert.matches("require cycle of [^\n]*ember.store.fs", out)
  end)

  it("reads tokens: a require in a comment or a string is no arrow", function()
    if not F.exists(lua_bin) then return end
    local dir = scratch()
    inject(dir, "ember/store/json.lua",
      "-- require(\"ember\")\nM.injected = [[ require(\"ember.cli\") ]] .. 'require(\"ember\")'")
    local out, rc = check(dir)
    assert.equal(0, rc, out)
  end)

  it("holds an alias to `return require(...)` of a library module, and refuses requiring it", function()
    if not F.exists(lua_bin) then return end
    local dir = scratch()
    H.write(dir .. "/ember/old_json.lua", "-- an old path\nreturn require(\"ember.store.json\")\n")
    local out, rc = check(dir)
    assert.equal(0, rc, out)
    inject(dir, "ember/store/fs.lua", "function M.injected() return require(\"ember.old_json\") end")
    out, rc = check(dir)
    assert.equal(1, rc, out)
    assert.matches("ember.store.fs requires ember.old_json, an alias of ember.store.json", out)
    H.write(dir .. "/ember/old_fs.lua",
      "-- an old path that does more\nlocal fs = require(\"ember.store.fs\")\nreturn fs\n")
    out, rc = check(dir)
    assert.matches("ember/old_fs.lua: a file directly in lib/ember besides init.lua and cli.lua is an alias", out)
  end)
end)
