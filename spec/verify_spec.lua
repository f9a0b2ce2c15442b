-- ember verify DIR (docs/artifacts.md, "Verifying an artifact"): a real capture replays bit for
-- bit (on its own settings and on another thread count), a tampered one (a flipped float whose
-- record and file digests were redone, so it reads as valid) is caught at that very float, another
-- kernel set agrees with a capture made directly on that set, and what cannot be replayed is named.

local ember = require("ember")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local artifact = require("ember.store.artifact")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")
local read = require("helpers.files").read

local MODEL_ARGS = "--family llama --dtype f32 --layers 2 --seed 7"
local PROMPT = "The quick brown fox"

local function copy(from, to)
  local f = assert(io.open(from, "rb"))
  local data = f:read("a")
  f:close()
  f = assert(io.open(to, "wb"))
  f:write(data)
  f:close()
end

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

describe("ember verify", function()
  local path, work, dir
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    if not path then return end
    work = fs.make_temp_dir("ember-verify-spec")
    copy(path, work .. "/m.gguf")
    dir = work .. "/cap"
    local code, _, err = C.ember("--model", work .. "/m.gguf", "--prompt", PROMPT, "--max-tokens", "3",
      "--capture-activations", dir, "--capture-stages", "all", "--threads", "1")
    assert(code == 0, err)
  end)
  teardown(function() if work then fs.remove_tree(work) end end)
  local function need() if not dir then pending("tiny model unavailable") end end

  it("replays a capture bit for bit, on its own thread count and on another", function()
    need()
    local m = artifact.read(dir).manifest
    for _, extra in ipairs({ {}, { "--threads", "2" } }) do
      local code, out = C.ember("verify", dir, table.unpack(extra))
      assert.equal(0, code, out)
      assert.matches(string.format("replayed on kernels %s, %s thread(s), KV f32", m.execution.kernels,
        extra[2] or "1"), out, 1, true)
      assert.matches(string.format("tensors: %d records compared", #m.records), out, 1, true)
      assert.matches(", 0 differing", out, 1, true)
      assert.matches(string.format("generated_ids: %d ids, identical", #m.generated_ids), out, 1, true)
      assert.matches("result: IDENTICAL", out, 1, true)
    end
  end)

  it("finds a flipped float of a re-digested artifact where it was flipped", function()
    need()
    local bad = work .. "/tampered"
    fs.mkdir_p(bad)
    local blob = read(dir .. "/tensors.safetensors")
    local n = string.unpack("<I8", blob)
    local header = json.decode(blob:sub(9, 8 + n))
    local m = json.decode(read(dir .. "/manifest.json"))
    local rec = m.records[5]
    local cols = rec.shape[2]
    local row, col = rec.shape[1] - 1, cols - 2
    local at = 8 + n + header[rec.name].data_offsets[1] + 4 * (row * cols + col) -- 0-based byte offset
    local was = blob:sub(at + 1, at + 4)
    local flipped = string.pack("<I4", string.unpack("<I4", was) ~ 1)
    blob = blob:sub(1, at) .. flipped .. blob:sub(at + 5)
    local a, b = table.unpack(header[rec.name].data_offsets)
    rec.sha256 = ember.sha256(blob:sub(8 + n + a + 1, 8 + n + b))
    local r = { stage = rec.stage, layer = rec.layer ~= json.null and rec.layer or nil, phase = rec.phase,
      start_position = rec.start_position, shape = rec.shape }
    rec.record_sha256 = artifact.record_digest(r, rec.name, rec.sha256)
    m.tensor_file.sha256 = ember.sha256(blob)
    write(bad .. "/tensors.safetensors", blob)
    write(bad .. "/manifest.json", json.encode(m))
    artifact.read(bad) -- it reads as a valid artifact
    local code, out = C.ember("verify", bad)
    assert.equal(1, code, out)
    local function show(bytes)
      return string.format("%.9g (0x%08x)", string.unpack("<f", bytes), string.unpack("<I4", bytes))
    end
    assert.matches(string.format("first difference: record 4 (%s), row %d, column %d: recorded %s, replayed %s",
      artifact.record_label(r), row, col, show(flipped), show(was)), out, 1, true)
    assert.matches(", 1 differing", out, 1, true)
    assert.matches("result: DIFFERENT", out, 1, true)
  end)

  it("on another kernel set says what a capture made directly on that set says", function()
    need()
    local m = artifact.read(dir)
    for _, set in ipairs({ "reference", "avx2" }) do
      if ember.cpu()[set] == false then goto continue end
      local direct = work .. "/direct-" .. set
      local code, _, err = C.ember("--model", work .. "/m.gguf", "--prompt", PROMPT, "--max-tokens", "3",
        "--capture-activations", direct, "--capture-stages", "all", "--threads", "1", "--kernels", set)
      assert.equal(0, code, err)
      local d = artifact.read(direct)
      local differing = 0
      for i, r in ipairs(m.records) do
        if r.tensor:bytes() ~= d.records[i].tensor:bytes() then differing = differing + 1 end
      end
      local out
      code, out = C.ember("verify", dir, "--kernels", set)
      assert.matches("replayed on kernels " .. set, out, 1, true)
      assert.matches(string.format(", %d differing", differing), out, 1, true)
      assert.equal(differing == 0 and 0 or 1, code)
      ::continue::
    end
  end)

  it("names a missing model file, a model of other bytes and a manifest that cannot be replayed", function()
    need()
    local moved = work .. "/moved"
    fs.mkdir_p(moved)
    copy(path, moved .. "/m.gguf")
    local code, _, err = C.ember("--model", moved .. "/m.gguf", "--prompt", PROMPT, "--capture-activations",
      moved .. "/cap",
      "--threads", "1")
    assert.equal(0, code, err)
    os.remove(moved .. "/m.gguf")
    code, _, err = C.ember("verify", moved .. "/cap")
    assert.equal(1, code)
    assert.matches("verify: '" .. moved .. "/cap': the model file '" .. moved .. "/m.gguf' does not exist (give "
      .. "--model PATH)", err, 1, true)
    local other = fx.tiny_model("--family llama --dtype f32 --layers 2 --seed 8")
    copy(other, moved .. "/m.gguf")
    code, _, err = C.ember("verify", moved .. "/cap")
    assert.equal(1, code)
    assert.matches("sha256 mismatch: the model file '" .. moved .. "/m.gguf' is " .. ember.sha256_file(other)
      .. ", the artifact was computed from " .. ember.sha256_file(path), err, 1, true)
    -- the right bytes under another name, given with --model
    code = C.ember("verify", moved .. "/cap", "--model", path)
    assert.equal(0, code)
    -- a manifest whose command line is not the generation command (a workflow script's)
    local m = json.decode(read(moved .. "/cap/manifest.json"))
    m.argv = { "ember-lua", "scripts/workflows/capture_patch_restore.lua" }
    write(moved .. "/cap/manifest.json", json.encode(m))
    code, _, err = C.ember("verify", moved .. "/cap", "--model", path)
    assert.equal(1, code)
    assert.matches("the manifest's argv ('ember-lua scripts/workflows/capture_patch_restore.lua') is not an ember "
      .. "generation command, which is what verify replays", err, 1, true)
    code, _, err = C.ember("verify")
    assert.equal(2, code)
    assert.matches("verify: one artifact directory, got 0 arguments", err, 1, true)
  end)
end)
