-- spec/fs_dirs_spec.lua — lib/ember/store/fs.lua's directory changes on the C binding (core.internal
-- mkdir, mkdir_p, remove_tree, realpath) and run/outputs.lua's path resolution: the OS reason in every
-- error, links never followed out of a removed tree, any byte in a name, and no process started.
-- What is on disk is checked with find(1) and realpath(1), not with the functions under test.
local fs = require("ember.store.fs")
local outputs = require("ember.run.outputs")

local q = fs.shell_quote

local run = require("helpers.child").run

local ROOT = run("pwd"):gsub("\n$", "")
local UID = tonumber(run("id -u"))

-- entries(dir) -> { [relative path] = "d" | "f" | "l" } of everything below dir, as find(1) sees
-- it (NUL-separated, so a newline in a name is one entry).
local function entries(dir)
  local found = {}
  for rec in run("find " .. q(dir) .. " -mindepth 1 -printf '%y %P\\0'"):gmatch("([^%z]*)%z") do
    found[rec:sub(3)] = rec:sub(1, 1)
  end
  return found
end

local function touch(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text or "")
  f:close()
end

-- lua_child(cwd, code [, unprivileged]): helpers.child's lua (as nobody when root and unprivileged).
local function lua_child(cwd, code, unprivileged)
  return require("helpers.child").lua(cwd, code, { unprivileged = unprivileged })
end

describe("ember.fs directory changes", function()
  local dir, outside
  before_each(function()
    dir = fs.make_temp_dir("ember-fs-dirs")
    -- make_temp_dir's directories are private (0700); the unprivileged children must get in
    assert(os.execute("chmod 755 " .. q(dir)))
  end)
  after_each(function()
    os.execute("chmod -R u+rwx " .. q(dir) .. " 2>/dev/null")
    fs.remove_tree(dir)
    if outside then fs.remove_tree(outside) end
    outside = nil
  end)

  it("mkdir makes one directory and says why it cannot: File exists, No such file, Not a directory", function()
    assert.is_true(fs.mkdir(dir .. "/a"))
    assert.same({ a = "d" }, entries(dir))
    touch(dir .. "/a/keep", "mine")
    touch(dir .. "/file")
    os.execute("ln -s nowhere " .. q(dir .. "/dangling"))
    for path, reason in pairs({
      [dir .. "/a"] = "File exists",
      [dir .. "/file"] = "File exists",
      [dir .. "/dangling"] = "File exists",
      [dir .. "/missing/b"] = "No such file or directory",
      [dir .. "/file/b"] = "Not a directory",
    }) do
      local ok, err = fs.mkdir(path)
      assert.is_nil(ok)
      assert.equal("cannot create directory '" .. path .. "': " .. reason, err)
    end
    assert.same({ a = "d", ["a/keep"] = "f", file = "f", dangling = "l" }, entries(dir))
  end)

  it("mkdir in a read-only directory is Permission denied, and remove_tree cannot empty it", function()
    assert.is_true(fs.mkdir(dir .. "/ro"))
    touch(dir .. "/ro/f", "kept")
    assert(os.execute("chmod 555 " .. q(dir .. "/ro")))
    local r, why = lua_child(dir, "local a, b = fs.mkdir('ro/x') local c, d = fs.remove_tree('ro') "
      .. "report(a, b, c, d, fs.mkdir_p('ro/y/z'))", true)
    if not r then return pending(why) end
    local ok, err, rok, rerr, pok, perr = table.unpack(r, 1, 6)
    assert.is_nil(ok)
    assert.equal("cannot create directory 'ro/x': Permission denied", err)
    assert.is_nil(rok)
    assert.equal("cannot remove 'ro/f': Permission denied", rerr)
    assert.is_nil(pok)
    assert.equal("cannot create directory 'ro/y': Permission denied", perr)
    assert.same({ ro = "d", ["ro/f"] = "f" }, entries(dir))
  end)

  it("mkdir_p makes every missing level, accepts what exists, and names the level that fails", function()
    assert.is_true(fs.mkdir_p(dir .. "/a/b/c"))
    assert.same({ a = "d", ["a/b"] = "d", ["a/b/c"] = "d" }, entries(dir))
    assert.is_true(fs.mkdir_p(dir .. "/a/b/c")) -- already there
    assert.is_true(fs.mkdir_p(dir .. "//a//b/d/e/")) -- doubled and trailing slashes
    assert.same({ a = "d", ["a/b"] = "d", ["a/b/c"] = "d", ["a/b/d"] = "d", ["a/b/d/e"] = "d" }, entries(dir))
    os.execute("ln -s a/b " .. q(dir .. "/lb"))
    assert.is_true(fs.mkdir_p(dir .. "/lb/f")) -- through a link to a directory, as mkdir -p
    assert.equal("d", entries(dir)["a/b/f"])
    touch(dir .. "/file")
    local ok, err = fs.mkdir_p(dir .. "/file/x/y")
    assert.is_nil(ok)
    assert.equal("cannot create directory '" .. dir .. "/file/x': Not a directory", err)
    ok, err = fs.mkdir_p(dir .. "/file")
    assert.is_nil(ok)
    assert.equal("cannot create directory '" .. dir .. "/file': File exists", err)
  end)

  it("remove_tree removes a link to a directory outside the tree, never what it points to", function()
    outside = fs.make_temp_dir("ember-fs-outside")
    assert.is_true(fs.mkdir_p(outside .. "/sub"))
    touch(outside .. "/keep.txt", "keep")
    touch(outside .. "/sub/deep.txt", "deep")
    assert.is_true(fs.mkdir_p(dir .. "/tree/a/b"))
    touch(dir .. "/tree/a/b/file", "x")
    assert(os.execute(table.concat({
      "ln -s " .. q(outside) .. " " .. q(dir .. "/tree/a/abs_dir"),
      "ln -s ../../../../" .. q(fs.basename(outside)) .. " " .. q(dir .. "/tree/a/b/rel_dir"),
      "ln -s " .. q(outside .. "/keep.txt") .. " " .. q(dir .. "/tree/file_link"),
      "ln -s nowhere " .. q(dir .. "/tree/dangling"),
      "ln -s " .. q(outside) .. " " .. q(dir .. "/top_link"),
    }, " && ")))
    assert.equal("d", entries(dir .. "/tree/a/b/rel_dir/")["sub"]) -- the relative link does lead outside
    local before = entries(outside)
    assert.is_true(fs.remove_tree(dir .. "/tree"))
    assert.same({ top_link = "l" }, entries(dir))
    assert.same(before, entries(outside))
    -- the top itself a link, with and without a trailing slash: the link goes, the target stays
    assert.is_true(fs.remove_tree(dir .. "/top_link/"))
    assert.same({}, entries(dir))
    assert.same(before, entries(outside))
    assert.equal("keep", require("helpers.files").read(outside .. "/keep.txt"))
    assert.is_true(fs.remove_tree(dir .. "/never-there")) -- nothing to remove is success, as rm -rf
  end)

  it("remove_tree refuses empty, '.' and '..' paths, and leaves everything in place", function()
    assert.is_true(fs.mkdir_p(dir .. "/sub/inner"))
    touch(dir .. "/canary")
    local ok, err = fs.remove_tree("")
    assert.is_nil(ok)
    assert.equal("refusing to remove an empty path", err)
    ok, err = fs.remove_tree(dir .. "/sub/..")
    assert.is_nil(ok)
    assert.equal("refusing to remove '" .. dir .. "/sub/..': its last component is '.' or '..'", err)
    local a, b, c, d = table.unpack(assert(lua_child(dir .. "/sub",
      "local a, b = fs.remove_tree('.') report(a, b, fs.remove_tree('inner/./'))")), 1, 4)
    assert.is_nil(a)
    assert.equal("refusing to remove '.': its last component is '.' or '..'", b)
    assert.is_nil(c)
    assert.equal("refusing to remove 'inner/./': its last component is '.' or '..'", d)
    assert.same({ sub = "d", ["sub/inner"] = "d", canary = "f" }, entries(dir))
  end)

  it("remove_tree refuses '/' in every spelling (checked as nobody, so a failure could remove nothing)", function()
    -- as any other user a broken refusal would remove that user's own files: only run as nobody
    if UID ~= 0 then return pending("needs root to run the check as nobody (id -u = " .. UID .. ")") end
    local r, why = lua_child("/", "local t = {} for _, p in ipairs({ '/', '//', '/./', '/tmp/..', 'tmp/../' }) do "
      .. "local ok, err = fs.remove_tree(p) t[#t + 1] = tostring(ok) .. ' ' .. tostring(err) end "
      .. "report(table.concat(t, '\\n'))", true)
    if not r then return pending(why) end
    assert.equal(table.concat({
      "nil refusing to remove '/'", "nil refusing to remove '/'",
      "nil refusing to remove '/./': its last component is '.' or '..'",
      "nil refusing to remove '/tmp/..': its last component is '.' or '..'",
      "nil refusing to remove 'tmp/../': its last component is '.' or '..'",
    }, "\n"), r[1])
    -- a link to / is only a link: resolving it names '/', and remove_tree on it removes the link
    assert(os.execute("ln -s / " .. q(dir .. "/root_link")))
    assert.equal("/", fs.realpath(dir .. "/root_link"))
    assert.is_true(fs.remove_tree(dir .. "/root_link"))
    assert.same({}, entries(dir))
    assert.is_true(fs.exists("/tmp"))
  end)

  it("handles names with spaces, quotes, newlines, globs, $( ) and a leading dash", function()
    local names = { "with space", "it's \"quoted\"", "new\nline", "-rf", "--", "-p x", "$(touch pwned)", "*", "a;b" }
    local real_dir = fs.realpath(dir)
    for _, name in ipairs(names) do
      local p = dir .. "/" .. name
      assert.is_true(fs.mkdir(p), name)
      assert.is_true(fs.mkdir_p(p .. "/" .. name .. "/inner"), name)
      touch(p .. "/" .. name .. "/inner/" .. name, name)
      assert.equal(real_dir .. "/" .. name, fs.realpath(p), name)
      assert.is_true(fs.is_dir(p .. "/" .. name), name)
    end
    local found = entries(dir)
    for _, name in ipairs(names) do
      assert.equal("d", found[name], name)
      assert.equal("f", found[name .. "/" .. name .. "/inner/" .. name], name)
    end
    for _, name in ipairs(names) do assert.is_true(fs.remove_tree(dir .. "/" .. name), name) end
    assert.same({}, entries(dir))
    assert.is_false(fs.exists(ROOT .. "/pwned"))
    -- relative paths that begin with a dash, from inside the directory (where a command would
    -- have read them as options)
    local r = assert(lua_child(dir, "local t = {} "
      .. "t[1] = fs.mkdir('-rf') t[2] = fs.mkdir_p('-p/-x y/--') t[3] = fs.realpath('-p/-x y') "
      .. "t[4] = fs.mkdir('--') t[5] = fs.remove_tree('-p') t[6] = fs.remove_tree('--') "
      .. "report(table.unpack(t, 1, 6))"))
    assert.same({ true, true, real_dir .. "/-p/-x y", true, true, true }, r)
    assert.same({ ["-rf"] = "d" }, entries(dir))
  end)

  it("realpath resolves as realpath(1) does and names a missing path with the OS reason", function()
    assert.is_true(fs.mkdir_p(dir .. "/a/b"))
    touch(dir .. "/a/file")
    os.execute("ln -s a/b " .. q(dir .. "/lb"))
    for _, p in ipairs({ dir, dir .. "/a/../a/b", dir .. "/lb", dir .. "/lb/../file", dir .. "//a/./file" }) do
      local oracle = run("realpath -e -- " .. q(p)):gsub("\n$", "")
      assert.equal(oracle, fs.realpath(p), p)
    end
    for path, reason in pairs({
      [dir .. "/missing"] = "No such file or directory",
      [dir .. "/missing/deeper"] = "No such file or directory",
      [dir .. "/a/file/x"] = "Not a directory",
      [""] = "No such file or directory",
    }) do
      local real, err = fs.realpath(path)
      assert.is_nil(real)
      assert.equal("cannot resolve '" .. path .. "': " .. reason, err)
    end
  end)

  it("outputs.check finds two spellings of one file through links and '..'", function()
    assert.is_true(fs.mkdir(dir .. "/d"))
    os.execute("ln -s d " .. q(dir .. "/alias"))
    local err = outputs.check({
      { flag = "--a", path = dir .. "/d/x.json", kind = "file" },
      { flag = "--b", path = dir .. "/alias/../alias/x.json", kind = "file" },
    })
    assert.equal("--a and --b both name '" .. dir .. "/alias/../alias/x.json': each output needs its own path", err)
    assert.is_nil(outputs.check({
      { flag = "--a", path = dir .. "/d/x.json", kind = "file" },
      { flag = "--b", path = dir .. "/missing/x.json", kind = "file" },
    }))
  end)

  it("mkdir takes a mode, make_temp_dir makes a private (0700) directory, isatty answers as test -t", function()
    local t = fs.make_temp_dir("ember-fs-mode")
    assert.are.equal("700", (run("stat -c %a " .. q(t)):gsub("%s+$", "")))
    local old = run("umask"):gsub("%s+$", "")
    assert(fs.mkdir(t .. "/m", tonumber("750", 8)))
    -- what the umask leaves of 0750, computed here
    local want = tonumber("750", 8) & ~tonumber(old, 8)
    assert.are.equal(string.format("%o", want), (run("stat -c %a " .. q(t .. "/m")):gsub("%s+$", "")))
    assert.has_error(function() fs.mkdir(t .. "/x", -1) end)
    assert.has_error(function() fs.mkdir(t .. "/x", 8 ^ 5 // 1) end)
    assert(fs.remove_tree(t))
    for fd = 0, 2 do
      assert.are.equal(os.execute("test -t " .. fd) == true, fs.isatty(fd), "fd " .. fd)
    end
    assert.is_false(fs.isatty(-1))
    assert.is_false(fs.isatty(123456))
  end)

  it("starts no process for any of it", function()
    local calls = require("helpers.processes").spawn_count(function()
      local t = fs.make_temp_dir("ember-fs-noproc")
      assert(fs.mkdir(t .. "/a"))
      assert(fs.mkdir_p(t .. "/a/b/c"))
      assert(fs.realpath(t .. "/a/b"))
      assert.is_nil(outputs.check({ { flag = "--x", path = t .. "/a/x.json", kind = "file" },
        { flag = "--y", path = t .. "/a/y.json", kind = "file" } }))
      assert(fs.remove_tree(t))
    end)
    assert.equal(0, calls)
  end)
end)
