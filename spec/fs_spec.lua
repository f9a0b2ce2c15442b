-- spec/fs_spec.lua — lib/ember/store/fs.lua's file tests on the stat binding (core.internal.stat and
-- list_dir): each kind of path answered as `test -e`/`test -d` would, the sweep of stale temporaries
-- by their age, and that a file test no longer starts a process.
local fs = require("ember.store.fs")
local internal = require("ember.core").internal

describe("ember.fs file tests", function()
  local dir
  before_each(function() dir = fs.make_temp_dir("ember-fs") end)
  after_each(function() fs.remove_tree(dir) end)

  local function touch(path, text)
    local f = assert(io.open(path, "wb"))
    f:write(text or "")
    f:close()
  end

  it("tells files, directories, links, FIFOs and missing paths apart", function()
    touch(dir .. "/f", "12345")
    assert(fs.mkdir(dir .. "/d"))
    assert(os.execute("ln -s f " .. fs.shell_quote(dir .. "/lf") .. " && ln -s d " .. fs.shell_quote(dir .. "/ld")
      .. " && ln -s nowhere " .. fs.shell_quote(dir .. "/broken") .. " && mkfifo " .. fs.shell_quote(dir .. "/p")))
    -- the expectation is the shell's own test(1) on each path
    local function sh_test(flag, p) return os.execute("test " .. flag .. " " .. fs.shell_quote(p)) == true end
    for _, name in ipairs({ "f", "d", "lf", "ld", "broken", "p", "missing" }) do
      local p = dir .. "/" .. name
      assert.equal(sh_test("-e", p), fs.exists(p), "exists " .. name)
      assert.equal(sh_test("-d", p), fs.is_dir(p), "is_dir " .. name)
    end
    assert.equal("file", internal.stat(dir .. "/f").type)
    assert.equal(5, internal.stat(dir .. "/f").size)
    assert.equal("fifo", internal.stat(dir .. "/p").type)
    assert.equal("link", internal.stat(dir .. "/lf", true).type)
    assert.equal("file", internal.stat(dir .. "/lf").type)
    local none, msg = internal.stat(dir .. "/missing")
    assert.is_nil(none)
    assert.truthy(msg:find(dir .. "/missing", 1, true))
  end)

  it("lists a directory without . and ..; a missing one is nil and a message naming it", function()
    touch(dir .. "/a")
    touch(dir .. "/b c")
    assert(fs.mkdir(dir .. "/sub"))
    local names = internal.list_dir(dir)
    table.sort(names)
    assert.same({ "a", "b c", "sub" }, names)
    local none, msg = internal.list_dir(dir .. "/missing")
    assert.is_nil(none)
    assert.truthy(msg:find(dir .. "/missing", 1, true))
  end)

  it("never sweeps the forms earlier versions wrote, however old (no writer can be proven dead)", function()
    touch(dir .. "/old.json.tmp-0123456789abcdef")
    touch(dir .. "/older.json.tmp-4194305-0123456789abcdef")
    touch(dir .. "/keep.json")
    assert(os.execute("touch -d '2 days ago' " .. fs.shell_quote(dir .. "/old.json.tmp-0123456789abcdef") .. " "
      .. fs.shell_quote(dir .. "/older.json.tmp-4194305-0123456789abcdef")))
    assert.same({}, fs.sweep_temps(dir))
    for _, n in ipairs({ "old.json.tmp-0123456789abcdef", "older.json.tmp-4194305-0123456789abcdef", "keep.json" }) do
      assert.is_true(fs.exists(dir .. "/" .. n), n)
    end
  end)

  it("answers a file test without starting a process", function()
    touch(dir .. "/f")
    local calls = require("helpers.processes").spawn_count(function()
      for _ = 1, 10 do
        assert.is_true(fs.is_dir(dir))
        assert.is_true(fs.exists(dir .. "/f"))
        fs.sweep_temps(dir)
      end
    end)
    assert.equal(0, calls)
  end)
end)
