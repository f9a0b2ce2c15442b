-- The library as shipped: lib/ember embedded in ember-lua (served by package.preload, EMBER_LIB
-- overriding it), `ember-lua -m`, the built-in experiments under ember.experiments, ember.cli.flags,
-- and the default tiny model made on first use in the cache directory.

local F = require("helpers.fixtures")
local H = require("helpers.artifacts")
local flags = require("ember.cli.flags")

local lua_bin = F.build .. "/ember-lua"

-- sh(cmd) -> output (stdout and stderr), exit code
local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local text = p:read("a")
  p:close()
  local rc = tonumber(text:match("rc=(%d+)\n$"))
  return text:gsub("rc=%d+\n$", ""), rc
end

local function need_ember_lua()
  if not F.exists(lua_bin) then pending("missing " .. lua_bin .. " (build the project first)") end
  return F.exists(lua_bin)
end

-- The module names lib/ember's files give require, found by listing the tree (not by asking ember).
local function library_modules()
  local p = io.popen("cd lib && find ember -name '*.lua' | sort")
  local names = {}
  for line in p:lines() do
    names[#names + 1] = (line:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))
  end
  p:close()
  return names
end

describe("ember-lua's embedded library", function()
  after_each(H.cleanup)

  it("serves every lib/ember module through package.preload, from any directory", function()
    if not need_ember_lua() then return end
    local from_root = "B=$(cd " .. H.shell_quote(F.build) .. " && pwd) && cd / && env -u EMBER_LIB \"$B/ember-lua\" -e "
    local names = library_modules()
    assert.is_true(#names > 10)
    local out, rc = sh("printf '%s\\n' " .. table.concat(names, " ") .. " | (" .. from_root .. H.shell_quote(
      "for line in io.lines() do io.write(line, '=', tostring(package.preload[line] ~= nil), '\\n') end") .. ")")
    assert.equal(0, rc, out)
    for _, n in ipairs(names) do assert.matches(n .. "=true\n", out, 1, true) end
    -- and the modules load from there: the path holds no lib directory
    out, rc = sh(from_root .. H.shell_quote(
      "require('ember.cli'); io.write(package.path:find('lib/?.lua', 1, true) and 'path' or 'no-path')"))
    assert.equal(0, rc, out)
    assert.equal("no-path", out)
  end)

  it("lets EMBER_LIB point at a development tree, which then wins over the embedded copy", function()
    if not need_ember_lua() then return end
    local dir = H.tmpdir()
    assert(os.execute("mkdir -p " .. H.shell_quote(dir .. "/ember")))
    H.write(dir .. "/ember/cli.lua", "return { main = function(arg) io.write('dev tree ', arg[1]) return 3 end }\n")
    local out, rc = sh("EMBER_LIB=" .. H.shell_quote(dir) .. " " .. H.shell_quote(lua_bin) .. " -m ember.cli x")
    assert.equal("dev tree x", out)
    assert.equal(3, rc) -- -m: main's result is the exit status
    out, rc = sh("EMBER_LIB=" .. H.shell_quote(dir) .. " " .. H.shell_quote(lua_bin) .. " -E -m ember.cli --version")
    assert.equal(0, rc, out)
    assert.equal("ember " .. require("ember").version .. "\n", out) -- -E: the embedded library
  end)

  it("refuses -m without a module, or a module without main", function()
    if not need_ember_lua() then return end
    local out, rc = sh(H.shell_quote(lua_bin) .. " -m")
    assert.equal(1, rc)
    assert.matches("'-m' needs argument", out, 1, true)
    out, rc = sh(H.shell_quote(lua_bin) .. " -m ember.store.json")
    assert.equal(1, rc)
    assert.matches("module 'ember.store.json' has no main function", out, 1, true)
  end)
end)

describe("ember-lua modes", function()
  after_each(H.cleanup)
  -- the tests change directory: the binary by its absolute path
  local lua_bin = lua_bin:sub(1, 1) == "/" and lua_bin or (os.getenv("PWD") .. "/" .. lua_bin)

  it("has the global ember in every mode: a script, -e, stdin and -m", function()
    if not need_ember_lua() then return end
    local dir = H.tmpdir()
    local probe = "io.write(type(ember), ' ', tostring(ember == require('ember')), '\\n')"
    H.write(dir .. "/s.lua", probe .. "\n")
    H.write(dir .. "/probe.lua", "return { main = function() " .. probe .. " return 0 end }\n")
    local bin = H.shell_quote(lua_bin)
    local cases = {
      bin .. " " .. H.shell_quote(dir .. "/s.lua"),
      bin .. " -e " .. H.shell_quote(probe),
      "printf '%s\\n' " .. H.shell_quote(probe) .. " | " .. bin .. " -",
      "LUA_PATH_5_4=" .. H.shell_quote(dir .. "/?.lua;;") .. " " .. bin .. " -m probe",
    }
    for _, cmd in ipairs(cases) do
      local out, rc = sh("unset EMBER_LIB; " .. cmd)
      assert.equal(0, rc, cmd .. "\n" .. out)
      assert.equal("table true\n", out, cmd)
    end
    -- a script may still use the name for its own value
    local out = sh(bin .. " -e " .. H.shell_quote("ember = 5 io.write(ember)"))
    assert.equal("5", out)
  end)

  it("lets a script require modules beside it, from any working directory", function()
    if not need_ember_lua() then return end
    local dir = H.tmpdir()
    assert(os.execute("mkdir -p " .. H.shell_quote(dir .. "/proj/pkg")))
    H.write(dir .. "/proj/helper.lua", "return { answer = 42 }\n")
    H.write(dir .. "/proj/pkg/init.lua", "return { name = 'pkg' }\n")
    H.write(dir .. "/proj/main.lua", "io.write(require('helper').answer, ' ', require('pkg').name)\n")
    local out, rc = sh("cd / && " .. H.shell_quote(lua_bin) .. " " .. H.shell_quote(dir .. "/proj/main.lua"))
    assert.equal(0, rc, out)
    assert.equal("42 pkg", out)
    -- through a relative path and a link to the script
    assert(os.execute("ln -s proj/main.lua " .. H.shell_quote(dir .. "/link.lua")))
    out, rc = sh("cd " .. H.shell_quote(dir) .. " && " .. H.shell_quote(lua_bin) .. " link.lua")
    assert.equal(0, rc, out)
    assert.equal("42 pkg", out)
    -- the script's directory comes after ember's own entries: it cannot shadow the library
    H.write(dir .. "/proj/shadow.lua", "io.write(package.path:match('[^;]*$'))\n")
    out = sh(H.shell_quote(lua_bin) .. " " .. H.shell_quote(dir .. "/proj/shadow.lua"))
    assert.equal(dir .. "/proj/?/init.lua", out)
  end)
end)

describe("built-in experiments", function()
  it("are modules of the library, and scripts/experiments/ files make the same experiments", function()
    local builtin = require("ember.run.builtin")
    local z = builtin.experiment("zero_layer_output", { target = "3:attention", notice = function() end })
    assert.equal("zero-layer-output", z.name)
    assert.equal(3, z.target.layer)
    local from_file = builtin.load("scripts/experiments/zero_layer_output.lua", "3:attention")
    assert.equal(z.name, from_file.name)
    assert.same(z.target, from_file.target)
    assert.equal("activation-stats", builtin.experiment("activation_stats", {}).name)
    assert.has_error(function() builtin.experiment("no_such_experiment") end)
  end)
end)

describe("ember.flags", function()
  local list = { { "model", "path", "FILE" }, { "n", flags.positive, "N" }, { "json", "bool" } }

  it("parses --name VALUE, --name=VALUE and booleans, and names the flag in usage errors", function()
    local o, pos = flags.parse({ "--model", "m.gguf", "x", "--n=3", "--json" }, 1, flags.spec(list))
    assert.same({ model = "m.gguf", n = 3, json = true }, o)
    assert.same({ "x" }, pos)
    local cases = {
      { { "--n", "0" }, "--n: expected a positive integer, got '0'" },
      { { "--model", "a", "--model", "b" }, "flag '--model' given more than once" },
      { { "--json=1" }, "flag '--json' takes no value (got '1')" },
      { { "--model" }, "flag '--model' needs a value (FILE)" },
      { { "--nope" }, "unknown flag '--nope'" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(flags.parse, c[1], 1, flags.spec(list))
      assert.is_false(ok)
      assert.is_true(flags.is_usage_error(err))
      assert.equal(c[2], tostring(err))
    end
  end)

  it("finds refused flags before parsing, and formats one help line per flag", function()
    assert.equal("json", flags.present({ "x", "--json", "--model=m" }, 1, { "json", "model" }))
    assert.is_nil(flags.present({ "--json" }, 2, { "json" }))
    local text = flags.usage({ "usage: x" }, { { "model", "path", "FILE", "the model" } }, { "end" })
    assert.equal("usage: x\n  " .. string.format("%-32s %s", "--model FILE", "the model") .. "\nend\n", text)
  end)
end)

describe("the default model", function()
  after_each(H.cleanup)

  -- runs `ember.model.default_model.path()` under stock lua5.4 with the given environment prefix
  local function default_path(env)
    return sh(env .. " LUA_PATH=" .. H.shell_quote(package.path) .. " LUA_CPATH=" .. H.shell_quote(package.cpath)
      .. " lua5.4 -e " .. H.shell_quote("io.write(require('ember.model.default_model').path())"))
  end

  it("is made on first use in $XDG_CACHE_HOME/ember, the same bytes make-tiny-model writes", function()
    local cache = H.tmpdir()
    local out, rc = default_path("XDG_CACHE_HOME=" .. H.shell_quote(cache))
    assert.equal(0, rc, out)
    assert.equal(cache .. "/ember/tiny-llama-q8_0.gguf", out)
    local tool = F.build .. "/make-tiny-model"
    if not F.exists(tool) then return pending("missing " .. tool .. " to compare with") end
    local expected = cache .. "/expected.gguf"
    assert(os.execute(H.shell_quote(tool) .. " --family llama --dtype q8_0 --seed 7 --out " .. H.shell_quote(expected)
      .. " >/dev/null"))
    assert.equal(H.read(expected), H.read(out))
    -- a second use finds it and leaves it alone
    local again = default_path("XDG_CACHE_HOME=" .. H.shell_quote(cache))
    assert.equal(out, again)
  end)

  it("falls back to ~/.cache/ember without XDG_CACHE_HOME (or with a relative one)", function()
    local home = H.tmpdir()
    for _, env in ipairs({ "env -u XDG_CACHE_HOME", "XDG_CACHE_HOME=relative/dir" }) do
      local out, rc = default_path(env .. " HOME=" .. H.shell_quote(home))
      assert.equal(0, rc, out)
      assert.equal(home .. "/.cache/ember/tiny-llama-q8_0.gguf", out)
    end
  end)

  it("says what is wrong when the cache directory cannot be made", function()
    local dir = H.tmpdir()
    H.write(dir .. "/file", "not a directory")
    local out, rc = default_path("XDG_CACHE_HOME=" .. H.shell_quote(dir .. "/file"))
    assert.equal(1, rc)
    assert.matches("default model: cannot create directory '" .. dir .. "/file", out, 1, true)
  end)
end)

describe("make-tiny-model --out", function()
  after_each(H.cleanup)

  it("creates the directories of --out, and the Lua maker names a missing one", function()
    local tool = F.build .. "/make-tiny-model"
    if not F.exists(tool) then return pending("missing " .. tool .. " (build the project first)") end
    local dir = H.tmpdir()
    local out, rc = sh(H.shell_quote(tool) .. " --family llama --dtype f32 --out "
      .. H.shell_quote(dir .. "/a/b/x.gguf"))
    assert.equal(0, rc, out)
    assert.is_true(F.exists(dir .. "/a/b/x.gguf"))
    -- the same bytes as a file written into an existing directory
    assert.is_true(require("ember").make_tiny_model(dir .. "/y.gguf", { family = "llama", dtype = "f32" }))
    assert.equal(H.read(dir .. "/y.gguf"), H.read(dir .. "/a/b/x.gguf"))
    local ok, err = require("ember").make_tiny_model(dir .. "/nope/x.gguf")
    assert.is_nil(ok)
    assert.equal(dir .. "/nope/x.gguf: directory '" .. dir .. "/nope' does not exist", err)
    H.write(dir .. "/file", "")
    out, rc = sh(H.shell_quote(tool) .. " --family llama --dtype f32 --out " .. H.shell_quote(dir .. "/file/x.gguf"))
    assert.equal(1, rc)
    assert.matches("make-tiny-model: " .. dir .. "/file/x.gguf: ", out, 1, true)
  end)
end)

-- The module paths the docs gave before the library moved into rooms, and where each lives now.
local OLD_PATHS = {
  ["ember.artifact"] = "ember.store.artifact", ["ember.capture"] = "ember.run.capture",
  ["ember.compare"] = "ember.analysis.compare", ["ember.compose"] = "ember.run.compose",
  ["ember.control_vector"] = "ember.run.control_vector", ["ember.experiment_args"] = "ember.run.experiment_args",
  ["ember.extract"] = "ember.analysis.extract", ["ember.manifest"] = "ember.store.manifest",
  ["ember.safetensors"] = "ember.store.safetensors", ["ember.sweep_progress"] = "ember.sweep.progress",
  ["ember.vector_file"] = "ember.store.vector_file", ["ember.flags"] = "ember.cli.flags",
}

describe("the documented module paths of before the rooms", function()
  it("each gives the very module of its room, under stock lua5.4", function()
    for old, new in pairs(OLD_PATHS) do
      assert.are.equal(require(new), require(old), old)
    end
  end)

  it("each gives the very module of its room in ember-lua's embedded library", function()
    if not need_ember_lua() then return end
    local checks = {}
    for old, new in pairs(OLD_PATHS) do
      checks[#checks + 1] = string.format("assert(require(%q) == require(%q), %q)", old, new, old)
    end
    local from_root = "B=$(cd " .. H.shell_quote(F.build) .. " && pwd) && cd / && env -u EMBER_LIB \"$B/ember-lua\" -e "
    local out, rc = sh(from_root .. H.shell_quote(table.concat(checks, " ") .. " io.write('ok')"))
    assert.equal(0, rc, out)
    assert.equal("ok", out)
  end)
end)
