-- guards_spec.lua — the tree's guards fail when they should: each runs on a scratch copy of the tree,
-- passes on the clean copy, and fails naming the place once one violation is injected into it.
local H = require("helpers.artifacts")
local fx = require("helpers.fixtures")
local files = require("helpers.files")

local q = H.shell_quote
local function sh(cmd) -- -> { code = exit code, out = everything the command printed }
  local p = assert(io.popen(cmd .. " 2>&1; echo \"rc=$?\""))
  local out = p:read("a")
  p:close()
  return { code = tonumber(out:match("rc=(%d+)\n?$")), out = (out:gsub("rc=%d+\n?$", "")) }
end
local ROOT = sh("realpath .").out:match("^(.-)\n") -- busted runs from the repository root
local BUILD = sh("realpath " .. q(fx.build)).out:match("^(.-)\n")

-- A scratch copy of these folders of the tree (and .clang-format), made once per describe block;
-- inject(path, edit) rewrites one of its files (edit(text) -> new text) until the test ends.
local function scratch_tree(dirs)
  local tree, injected = {}, {}
  function tree.dir()
    if not tree.path then
      tree.path = H.tmpdir()
      local list = {}
      for i, d in ipairs(dirs) do list[i] = q(d) end
      assert(os.execute("cd " .. q(ROOT) .. " && cp -R " .. table.concat(list, " ") .. " .clang-format "
        .. q(tree.path)))
    end
    return tree.path
  end
  function tree.inject(path, edit)
    local text = files.read(tree.dir() .. "/" .. path)
    local new = edit(text)
    assert(new ~= text, "the injection changed nothing in " .. path)
    injected[#injected + 1] = { path, text }
    H.write(tree.path .. "/" .. path, new)
    return new
  end
  function tree.restore()
    for i = #injected, 1, -1 do H.write(tree.path .. "/" .. injected[i][1], injected[i][2]) end
    injected = {}
  end
  function tree.remove()
    tree.path = nil
    H.cleanup()
  end
  return tree
end

-- text with `line` put right after its opening comment block (C) / comment lines (Lua)
local function after_opening_comment(line)
  return function(text)
    local close = text:find("*/\n", 1, true)
    if text:sub(1, 2) == "/*" and close then return text:sub(1, close + 2) .. line .. "\n" .. text:sub(close + 3) end
    local i = 1
    while text:sub(i, i + 1) == "--" do i = text:find("\n", i, true) + 1 end
    return text:sub(1, i - 1) .. line .. "\n" .. text:sub(i)
  end
end

-- the line number of the first line of `text` holding `needle`
local function line_of(text, needle)
  local n = 0
  for l in (text .. "\n"):gmatch("(.-)\n") do
    n = n + 1
    if l:find(needle, 1, true) then return n end
  end
end

local function expect_pass(r) assert.are.equal(0, r.code, r.out) end
local function expect_fail(r, ...)
  assert.are_not.equal(0, r.code, r.out)
  for _, s in ipairs({ ... }) do assert.is_truthy(r.out:find(s, 1, true), "'" .. s .. "' missing from:\n" .. r.out) end
end

-- a describe block's scratch tree, restored after each test and removed after the block
local function tree_for(dirs)
  local tree = scratch_tree(dirs)
  after_each(tree.restore)
  teardown(tree.remove)
  return tree
end

describe("check_style.sh", function()
  local tree = tree_for({ "src", "include", "tools", "tests", "fuzz", "lib", "spec", "scripts", "bench" })
  local function style() return sh("bash " .. q(ROOT .. "/tests/check_style.sh") .. " " .. q(tree.dir())) end

  it("passes on a clean copy of the tree, and on a line of exactly 120 characters with multibyte ones", function()
    expect_pass(style())
    tree.inject("lib/ember/init.lua", after_opening_comment("-- " .. string.rep("—", 117)))
    expect_pass(style())
  end)

  it("fails on a 121-column line, in Lua and in C", function()
    for _, case in ipairs({ { "lib/ember/init.lua", "-- " }, { "src/engine/escape.c", "// " } }) do
      local line = case[2] .. string.rep("x", 118)
      local n = line_of(tree.inject(case[1], after_opening_comment(line)), line)
      expect_fail(style(), case[1] .. ":" .. n .. ": line longer than 120 columns")
      tree.restore()
    end
  end)

  it("fails on a file that does not open with its comment", function()
    for _, path in ipairs({ "src/kernels/rope.c", "lib/ember/init.lua" }) do
      local first = path:match("%.c$") and "#include <stddef.h>\n" or "local _ = 1\n"
      tree.inject(path, function(text) return first .. text end)
      expect_fail(style(), path .. ": does not open with a comment saying what it owns")
      tree.restore()
    end
  end)

  it("fails on a function body whose brace stands on its own line", function()
    local path, sig = "src/engine/escape.c", nil
    local text = tree.inject(path, function(text)
      local a, b = text:find("\n[%w_][^\n]*%) {\n") -- the first function definition
      sig = text:sub(a + 1, b - 3)
      return text:sub(1, b - 3) .. "\n{\n" .. text:sub(b + 1)
    end)
    expect_fail(style(), path .. ":" .. line_of(text, sig) + 1 .. ": function brace on its own line")
  end)
end)

describe("check_format.sh", function()
  local tree = tree_for({ "src", "include", "tools", "tests", "fuzz", "bench" })
  local function format() return sh("bash " .. q(ROOT .. "/tests/check_format.sh") .. " " .. q(tree.dir())) end

  it("passes on a clean copy of the tree and fails on one misformatted line", function()
    local r = format()
    if r.code == 77 then return pending(r.out) end
    expect_pass(r)
    local text = tree.inject("src/kernels/error.c", function(t) return t .. "static int  guard_probe;\n" end)
    expect_fail(format(), "src/kernels/error.c:" .. line_of(text, "guard_probe") .. ":",
      "1 line(s) not as .clang-format lays them out")
  end)
end)

describe("check_layers.lua", function()
  local tree = tree_for({ "src", "include", "tools", "tests", "fuzz", "lib", "scripts", "spec" })
  local function layers(...)
    local args = { q(ROOT .. "/tests/check_layers.lua"), q(tree.dir()), q(BUILD) }
    for _, a in ipairs({ ... }) do args[#args + 1] = q(a) end
    return sh("lua5.4 " .. table.concat(args, " "))
  end
  local function need_build()
    if not fx.exists(BUILD .. "/compile_commands.json") or not fx.exists(BUILD .. "/libember_kernels.a") then
      pending("no build in " .. BUILD .. " with compile_commands.json and the layer libraries (cmake --build build)")
      return false
    end
    return true
  end

  it("passes on a clean copy of the tree", function()
    if not need_build() then return end
    local r = layers()
    expect_pass(r)
    assert.matches("layers hold", r.out)
  end)

  it("fails on an upward include by a ../ path (kernels, tokenizer, bindings) or a Lua header", function()
    if not need_build() then return end
    for _, case in ipairs({
      { "src/kernels/ref.c", '#include "../engine/model.h"', "the kernels may not include the engine's model.h" },
      { "src/tokenizer/tokenizer.c", '#include "../engine/model.h"', "the tokenizer may not include the engine's" },
      { "src/lua_bindings/l_fs.c", '#include "../engine/gguf.h"', "the bindings may not include the engine's gguf.h" },
      { "src/engine/file.c", "#include <lua5.4/lua.h>", "the engine may not include Lua's lua.h" },
    }) do
      local n = line_of(tree.inject(case[1], after_opening_comment(case[2])), case[2])
      expect_fail(layers(), case[1] .. ":" .. n .. ": " .. case[2], case[3])
      tree.restore()
    end
  end)

  -- src/kernels/error.c compiled with one more function, which calls `callee`, into a copy of the
  -- kernels' library in place of its error.c.o
  local function kernels_calling(callee)
    local dir = tree.dir()
    tree.inject("src/kernels/error.c", function(text)
      return text .. "void " .. callee .. "(void *);\nvoid ember_guard_probe(void);\n"
        .. "void ember_guard_probe(void) { " .. callee .. "(0); }\n"
    end)
    local obj, lib = dir .. "/error.c.o", dir .. "/libember_kernels.a"
    expect_pass(sh("cc -c -I " .. q(dir .. "/src/kernels") .. " " .. q(dir .. "/src/kernels/error.c")
      .. " -o " .. q(obj) .. " && cp " .. q(BUILD .. "/libember_kernels.a") .. " " .. q(lib)
      .. " && ar r " .. q(lib) .. " " .. q(obj)))
    return lib
  end

  it("fails on an upward symbol: src/kernels/error.c calling the engine, or Lua", function()
    if not need_build() then return end
    local lib = kernels_calling("ember_model_free")
    expect_pass(layers()) -- the build's own kernels library, still the clean one
    expect_fail(layers("kernels=" .. lib),
      "libember_kernels.a (the kernels): error.c.o uses ember_model_free, defined by the engine")
    tree.restore()
    expect_fail(layers("kernels=" .. kernels_calling("lua_gettop")), "error.c.o uses lua_gettop, defined by Lua")
  end)

  it("fails on a library module requiring a spec helper or a C module the library does not load", function()
    if not need_build() then return end
    for _, case in ipairs({
      { 'local _ = require("helpers.files")', 'require("helpers.files") is spec/helpers/files.lua, a spec helper' },
      { 'local _ = require("socket")', 'require("socket") is no module of lib/ nor a C module the library loads' },
    }) do
      local n = line_of(tree.inject("lib/ember/init.lua", after_opening_comment(case[1])), case[1])
      expect_fail(layers(), "lib/ember/init.lua:" .. n .. ": " .. case[2])
      tree.restore()
    end
  end)
end)
