-- The activation artifact: manifest.json + one safetensors file, written atomically and verified
-- when read. The safetensors file is checked with a tiny reader written here from the format's
-- description (8-byte LE length, JSON header, byte buffer), not with ember's own loader.

local cjson = require("cjson")
local artifact = require("ember.store.artifact")
local json = require("ember.store.json")
local H = require("helpers.artifacts")

-- An independent safetensors reader: returns header table and the data buffer.
local function read_safetensors(path)
  local s = H.read(path)
  local n = string.unpack("<I8", s)
  local header = cjson.decode(s:sub(9, 8 + n))
  return header, s:sub(9 + n)
end

local function write_sample(dir, patch_sections, values)
  return artifact.write(dir, H.sections(patch_sections), H.records(values))
end

describe("artifact.write", function()
  after_each(H.cleanup)

  it("writes manifest.json and tensors.safetensors, and nothing else", function()
    local dir = H.tmpdir() .. "/art"
    write_sample(dir)
    assert.same({ "manifest.json", "tensors.safetensors" }, H.listdir(dir))
    local m = cjson.decode(H.read(dir .. "/manifest.json"))
    assert.equal("ember.activations", m.schema)
    assert.equal(artifact.SCHEMA_VERSION, m.schema_version)
    assert.equal(4, #m.records)
    assert.same({ 2, 3 }, m.records[1].shape)
    assert.equal(cjson.null, m.records[2].layer)
  end)

  it("produces a safetensors file a generic reader opens, with the exact bytes and hashes", function()
    local dir = H.tmpdir() .. "/art"
    write_sample(dir)
    local m = cjson.decode(H.read(dir .. "/manifest.json"))
    local header, buffer = read_safetensors(dir .. "/tensors.safetensors")
    local expected = H.records()
    local covered = 0
    for i, rec in ipairs(m.records) do
      local e = header[rec.name]
      assert.is_table(e, rec.name)
      assert.equal("F32", e.dtype)
      assert.same(rec.shape, e.shape)
      local bytes = buffer:sub(e.data_offsets[1] + 1, e.data_offsets[2])
      assert.equal(expected[i].data, bytes)
      covered = covered + #bytes
      local oracle = H.sha256sum(bytes)
      if oracle then assert.equal(oracle, rec.sha256) end
    end
    assert.equal(#buffer, covered)
    local oracle = H.sha256sum(H.read(dir .. "/tensors.safetensors"))
    if oracle then assert.equal(oracle, m.tensor_file.sha256) end
    -- the header's own metadata names the format for readers that never see manifest.json
    assert.equal("ember.activations", header.__metadata__.schema)
  end)

  it("is deterministic: the same inputs give byte-identical files", function()
    local base = H.tmpdir()
    write_sample(base .. "/one")
    write_sample(base .. "/two", function(s) s.capture.output_dir = "/tmp/a" end)
    assert.equal(H.read(base .. "/one/manifest.json"), H.read(base .. "/two/manifest.json"))
    assert.equal(H.read(base .. "/one/tensors.safetensors"), H.read(base .. "/two/tensors.safetensors"))
  end)

  it("refuses to overwrite an existing directory and leaves it untouched", function()
    local dir = H.tmpdir()
    H.write(dir .. "/keep.txt", "mine")
    local ok, err = pcall(write_sample, dir)
    assert.is_false(ok)
    assert.matches("already exists", err, 1, true)
    assert.same({ "keep.txt" }, H.listdir(dir))
  end)

  it("leaves no partial output when the write fails", function()
    local base = H.tmpdir()
    local bad = H.records()
    bad[3].data = bad[3].data:sub(1, 8) -- shape says 3 floats, data holds 2
    local ok, err = pcall(artifact.write, base .. "/art", H.sections(), bad)
    assert.is_false(ok)
    assert.matches("record 2", err, 1, true)
    assert.same({}, H.listdir(base))
    ok, err = pcall(write_sample, base .. "/missing-parent/art")
    assert.is_false(ok)
    assert.matches("parent directory", err, 1, true)
    assert.same({}, H.listdir(base))
  end)

  it("refuses an artifact without the required provenance", function()
    local ok, err = pcall(write_sample, H.tmpdir() .. "/art", function(s) s.prompt.sha256 = nil end)
    assert.is_false(ok)
    assert.matches("prompt.sha256", err, 1, true)
    ok, err = pcall(write_sample, H.tmpdir() .. "/art", function(s) s.input_ids = { 1, 2.5 } end)
    assert.is_false(ok)
    assert.matches("input_ids[2]", err, 1, true)
  end)

  it("refuses records with a layer on a logits stage or none on a layer stage", function()
    local recs = H.records()
    recs[2].layer = 0
    local ok, err = pcall(artifact.write, H.tmpdir() .. "/art", H.sections(), recs)
    assert.is_false(ok)
    assert.matches("after_logits has no layer", err, 1, true)
    recs = H.records()
    recs[1].layer = nil
    ok, err = pcall(artifact.write, H.tmpdir() .. "/art", H.sections(), recs)
    assert.is_false(ok)
    assert.matches("needs a non-negative integer layer", err, 1, true)
  end)
end)

describe("artifact.read", function()
  after_each(H.cleanup)

  it("returns the records with their data, keys and integer fields", function()
    local dir = H.tmpdir() .. "/art"
    write_sample(dir)
    local a = artifact.read(dir)
    local want = H.records()
    assert.equal(4, #a.records)
    for i, r in ipairs(a.records) do
      assert.equal("ember.Tensor", getmetatable(r.tensor).__name)
      assert.same(r.shape, r.tensor:shape())
      assert.equal(want[i].data, r.tensor:bytes())
      assert.equal(want[i].stage, r.stage)
      assert.equal(want[i].layer, r.layer)
      assert.equal("integer", math.type(r.start_position))
    end
    assert.equal("after_logits|-|decode|2", artifact.record_key(a.records[4]))
    assert.same({ 1, 2 }, a.manifest.input_ids)
    assert.equal("integer", math.type(a.manifest.input_ids[1]))
  end)

  it("binds the kept prompt text to prompt.sha256: an edited text is refused", function()
    local dir = H.tmpdir() .. "/art"
    write_sample(dir) -- prompt "hi" with its sha256 (helpers.artifacts, from sha256sum)
    assert.equal("hi", artifact.read(dir).manifest.prompt.text)
    local path = dir .. "/manifest.json"
    local text = H.read(path)
    local edited, n = text:gsub('"text": "hi"', '"text": "ho"')
    assert.equal(1, n)
    H.write(path, edited)
    local ok, err = pcall(artifact.read, dir)
    assert.is_false(ok)
    assert.matches("artifact '" .. dir .. "': prompt.text does not match prompt.sha256: the manifest was edited",
      err, 1, true)
  end)

  it("detects a flipped byte in a tensor and names the record", function()
    local dir = H.tmpdir() .. "/art"
    write_sample(dir)
    local path = dir .. "/tensors.safetensors"
    local s = H.read(path)
    local pos = #s - 5 -- inside the last tensor's data
    H.write(path, s:sub(1, pos - 1) .. string.char(s:byte(pos) ~ 0x01) .. s:sub(pos + 1))
    local ok, err = pcall(artifact.read, dir)
    assert.is_false(ok)
    assert.matches("record 3 (after_logits decode @2): sha256 mismatch", err, 1, true)
  end)

  it("detects a manifest whose recorded sha256 was edited", function()
    local dir = H.tmpdir() .. "/art"
    write_sample(dir)
    local m = H.read(dir .. "/manifest.json")
    local first = m:match('"byte_order": "little",\n%s*"sha256": "(%x+)"') -- the first record's digest
    assert.is_string(first)
    H.write(dir .. "/manifest.json", (m:gsub(first, string.rep("0", 64), 1)))
    local ok, err = pcall(artifact.read, dir)
    assert.is_false(ok)
    assert.matches("sha256 mismatch (manifest " .. string.rep("0", 64), err, 1, true)
  end)

  it("refuses truncated or absurd tensor files with a clear message", function()
    local dir = H.tmpdir() .. "/art"
    write_sample(dir)
    local path = dir .. "/tensors.safetensors"
    local s = H.read(path)
    H.write(path, s:sub(1, #s - 4))
    local ok, err = pcall(artifact.read, dir)
    assert.is_false(ok)
    assert.matches("tensors.safetensors", err, 1, true)
    H.write(path, string.pack("<I8", 1 << 40) .. s:sub(9))
    ok, err = pcall(artifact.read, dir)
    assert.is_false(ok)
    assert.matches("header length", err, 1, true)
    H.write(path, "tiny")
    ok, err = pcall(artifact.read, dir)
    assert.is_false(ok)
    assert.matches("too short", err, 1, true)
  end)

  it("refuses another schema version, a foreign dtype or byte order, and a stray tensor", function()
    local function edited(from, to)
      local dir = H.tmpdir() .. "/art"
      write_sample(dir)
      local m = H.read(dir .. "/manifest.json")
      local replaced, n = m:gsub(from, to, 1)
      assert.equal(1, n, from)
      H.write(dir .. "/manifest.json", replaced)
      local ok, err = pcall(artifact.read, dir)
      assert.is_false(ok)
      return err
    end
    assert.matches("unsupported schema_version '2.0.0'",
      edited('"schema_version": "1%.1%.0"', '"schema_version": "2.0.0"'), 1, true)
    assert.matches("unsupported dtype 'f16'", edited('"dtype": "f32"', '"dtype": "f16"'), 1, true)
    assert.matches("unsupported byte order 'big'", edited('"byte_order": "little"', '"byte_order": "big"'), 1, true)
    assert.matches("not an ember activation artifact",
      edited('"schema": "ember%.activations"', '"schema": "other"'), 1, true)
  end)

  it("says which file is missing", function()
    local ok, err = pcall(artifact.read, H.tmpdir())
    assert.is_false(ok)
    assert.matches("manifest.json", err, 1, true)
    ok, err = pcall(artifact.read, "/nonexistent/ember-artifact")
    assert.is_false(ok)
    assert.matches("not a directory", err, 1, true)
  end)
end)

describe("json (deterministic artifact text)", function()
  it("writes u64 fingerprints as full unsigned integers", function()
    assert.equal("18446744073709551615", json.encode(json.u64(-1)))
    assert.equal("9223372036854775808", json.encode(json.u64(math.mininteger)))
    assert.equal("12345", json.encode(json.u64(12345)))
  end)

  it("keeps listed keys in order, sorts the rest, and round-trips floats exactly", function()
    local text = json.encode(json.ordered({ "z", "a" }, { a = 1, z = 2, m = 0.1, b = 1 / 3 }))
    assert.equal('{"z":2,"a":1,"b":0.3333333333333333,"m":0.1}', text)
    assert.equal(1 / 3, cjson.decode(text).b)
    assert.equal("1.0", json.encode(1.0))
    assert.equal('"NaN"', json.encode(0 / 0))
    assert.equal('"a/b\\\\/c"', json.encode("a/b\\/c"))
    assert.equal("a/b\\/c", cjson.decode(json.encode("a/b\\/c")))
  end)
end)
