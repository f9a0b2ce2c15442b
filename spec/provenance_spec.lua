-- The model digest in run manifests: computed once and then read from the digest cache for an
-- unchanged file, computed again after the file is touched, when the cache entry is corrupt and
-- with --verify-model; the manifest says which (model.sha256_source), and compare ignores that.
-- Runs go through the real launcher with XDG_CACHE_HOME set to a scratch directory, so no spec
-- touches the user's cache.

local cjson = require("cjson")
local H = require("helpers.artifacts")
local C = require("helpers.cli")

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local text = p:read("a")
  p:close()
  return text
end

describe("model digest cache", function()
  after_each(H.cleanup)

  local build = (os.getenv("EMBER_BUILD") or "build") .. "/ember-lua"
  local dir, model, cache, expected

  -- a copy of the tiny model with a modification time in the past (a file written within the
  -- last seconds is hashed but not cached: docs/artifacts.md)
  local function setup()
    if not io.open(build, "rb") then pending("missing " .. build); return false end
    local src = C.need_model()
    if not src then return false end
    dir = H.tmpdir()
    model, cache = dir .. "/model.gguf", dir .. "/cache"
    local bytes = H.read(src)
    H.write(model, bytes)
    assert(os.execute("touch -d @1500000000 " .. H.shell_quote(model)))
    expected = H.sha256sum(bytes)
    if not expected then pending("sha256sum (coreutils) is not installed"); return false end
    return true
  end

  -- one run with --activation-stats; returns its run manifest
  local n = 0
  local function run(...)
    n = n + 1
    local manifest = string.format("%s/run-%d.json", dir, n)
    local cmd = string.format("XDG_CACHE_HOME=%s EMBER_LUA=%s tools/ember --model %s --prompt hi --max-tokens 2 "
      .. "--activation-stats %s/stats-%d.json --run-manifest %s", H.shell_quote(cache), H.shell_quote(build),
      H.shell_quote(model), H.shell_quote(dir), n, H.shell_quote(manifest))
    for _, a in ipairs({ ... }) do cmd = cmd .. " " .. H.shell_quote(a) end
    local text = sh(cmd)
    assert.matches("rc=0", text, 1, true)
    return cjson.decode(H.read(manifest)), text
  end

  local function entries()
    return H.listdir(cache .. "/ember/model-sha256")
  end

  it("hashes once, then reads the cache for the unchanged file; touching it means a new hash", function()
    if not setup() then return end
    local m1 = run()
    assert.equal(expected, m1.model.sha256)
    assert.equal("fresh", m1.model.sha256_source)
    assert.equal(1, #entries())
    local m2 = run()
    assert.equal(expected, m2.model.sha256)
    assert.equal("cached", m2.model.sha256_source)
    -- a new modification time (the content is the same): the key changed, so the file is hashed
    assert(os.execute("touch -d @1500000100 " .. H.shell_quote(model)))
    local m3 = run()
    assert.equal("fresh", m3.model.sha256_source)
    assert.equal(expected, m3.model.sha256)
    assert.equal("cached", run().model.sha256_source)
  end)

  it("--verify-model hashes again, and a corrupt cache entry is ignored", function()
    if not setup() then return end
    assert.equal("fresh", run().model.sha256_source)
    local m = run("--verify-model")
    assert.equal("fresh", m.model.sha256_source)
    assert.equal(expected, m.model.sha256)
    local entry = cache .. "/ember/model-sha256/" .. entries()[1]
    -- an entry for the right key that names a wrong digest would be believed (the key is the
    -- contract); one that is not a well-formed entry never is
    H.write(entry, "ember-model-sha256 1\ndev x\n\0garbage")
    local c, text = run()
    assert.equal("fresh", c.model.sha256_source)
    assert.equal(expected, c.model.sha256)
    assert.is_nil(text:find("ember:.*cache", 1))
    assert.equal("cached", run().model.sha256_source)
  end)

  it("compare-artifacts classes a fresh and a cached run of the same capture as exact", function()
    if not setup() then return end
    local function capture(name)
      local cmd = string.format("XDG_CACHE_HOME=%s EMBER_LUA=%s tools/ember --model %s --prompt hi --max-tokens 2 "
        .. "--capture-activations %s/%s --run-manifest %s/run.json", H.shell_quote(cache), H.shell_quote(build),
        H.shell_quote(model), H.shell_quote(dir), name, H.shell_quote(dir))
      assert.matches("rc=0", sh(cmd), 1, true)
      return cjson.decode(H.read(dir .. "/" .. name .. "/manifest.json"))
    end
    local a, b = capture("a"), capture("b")
    assert.equal("fresh", a.model.sha256_source)
    assert.equal("cached", b.model.sha256_source)
    local res = require("ember.analysis.compare").compare_dirs(dir .. "/a", dir .. "/b")
    assert.equal("exact", res.class, res.reason)
    local seen = false
    for _, d in ipairs(res.provenance_differences) do
      if d.path == "model.sha256_source" then seen = true; assert.equal("ignored", d.kind) end
    end
    assert.is_true(seen)
  end)
end)

describe("model:sha256", function()
  it("gives the file's digest and its source; load checks the option types", function()
    local path = C.need_model()
    if not path then return end
    local want = H.sha256sum(H.read(path))
    if not want then return pending("sha256sum (coreutils) is not installed") end
    local ember = require("ember")
    local m = ember.load { model = path, verify_model = true }
    local hex, source = m:sha256()
    assert.equal(want, hex)
    assert.equal("fresh", source) -- verify_model: never from the cache
    assert.equal(hex, (m:sha256())) -- repeatable
    m:close()
    assert.has_error(function() m:sha256() end, "attempt to use a closed model")
    -- started at load and never collected: closing stops it
    ember.load({ model = path, provenance = true }):close()
    assert.has_error(function() ember.load { model = path, provenance = "yes" } end,
      "bad argument #1 to 'load' (option 'provenance' must be a boolean, got string)")
  end)
end)

teardown(function() require("helpers.fixtures").cleanup() end)
