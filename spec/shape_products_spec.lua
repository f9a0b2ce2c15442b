-- Shape products: a file that claims a [2^32, 2^32] tensor and holds no data. In 64-bit integers
-- 2^32 * 2^32 wraps to 0, so "0 bytes needed" matched the empty data: a 128-byte .npy, a
-- safetensors file, or an artifact whose digests are all valid was accepted, `--steer FILE@0` then
-- crashed and compare-artifacts called two such artifacts "exact". Each reader must refuse the
-- shape, naming the file; the command line must exit 2 with the reason, never die by a signal
-- (those cases run in a child ember-lua process, so a crash is this spec's failure, not busted's).

local ember = require("ember")
local shape = require("ember.store.shape")
local H = require("helpers.artifacts")
local fx = require("helpers.fixtures")
local cli = require("helpers.cli")

local BIG = 1 << 32

-- A .npy v1.0 file of `descr` and shape `dims` (text as numpy writes it), header padded to 128
-- bytes in all, then `data`.
local function npy_bytes(dims_text, data)
  local header = string.format("{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims_text)
  header = header .. string.rep(" ", 128 - 10 - #header - 1) .. "\n"
  return "\147NUMPY\1\0" .. string.pack("<I2", #header) .. header .. (data or "")
end

-- A safetensors file with one tensor `name` of `dims` and data_offsets [0, #data].
local function safetensors_bytes(name, dims, data)
  local text = string.format('{"%s":{"dtype":"F32","shape":[%s],"data_offsets":[0,%d]}}', name,
    table.concat(dims, ","), #data)
  return string.pack("<I8", #text) .. text .. data
end

local function sha256(s) return ember.sha256(s) end

-- An artifact directory with one record of shape {rows, cols} and `data`, every digest valid
-- (tensor sha256, record_sha256, tensor file sha256), written by hand as an attacker would.
local function crafted_artifact(dir, rows, cols, data)
  local artifact = require("ember.store.artifact")
  local json = require("ember.store.json")
  local r = { stage = "after_mlp", layer = 1, phase = "prefill", start_position = 0, shape = { rows, cols } }
  local name = string.format("r%06d.%s.L%d.%s.p%d", 0, r.stage, r.layer, r.phase, r.start_position)
  local blob = safetensors_bytes(name, { string.format("%d", rows), string.format("%d", cols) }, data)
  local m = H.sections()
  m.schema, m.schema_version = artifact.SCHEMA, artifact.SCHEMA_VERSION
  m.tensor_file = { name = artifact.TENSORS, size = #blob, sha256 = sha256(blob) }
  m.records = json.array({ {
    index = 0, name = name, stage = r.stage, layer = r.layer, phase = r.phase, start_position = 0,
    shape = json.array({ rows, cols }), dtype = "f32", byte_order = "little", sha256 = sha256(data),
    record_sha256 = artifact.record_digest(r, name, sha256(data)),
  } })
  for _, k in ipairs({ "input_ids", "generated_ids", "argv" }) do m[k] = json.array(m[k]) end
  assert(os.execute("mkdir -p " .. H.shell_quote(dir)))
  H.write(dir .. "/" .. artifact.TENSORS, blob)
  H.write(dir .. "/" .. artifact.MANIFEST, json.encode(m))
  return dir
end

-- `ember ARGS` in a child ember-lua on this tree's lib -> how it ended ("exit" | "signal"), its
-- code, its stderr.
local function ember_child(...)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = H.shell_quote(a) end
  local err = os.tmpname()
  local cmd = string.format("EMBER_LIB=%s %s -m ember.cli %s >/dev/null 2>%s",
    H.shell_quote(os.getenv("PWD") .. "/lib"), H.shell_quote(fx.build .. "/ember-lua"), table.concat(args, " "),
    H.shell_quote(err))
  local _, how, code = os.execute(cmd)
  local text = require("helpers.files").read(err)
  os.remove(err)
  return how, code, text
end

describe("ember.store.shape.count", function()
  it("refuses a product beyond the bound before forming it (2^32 x 2^32 does not wrap to 0)", function()
    assert.are.equal(0, BIG * BIG) -- the wrap this guards against
    local n, why = shape.count({ BIG, BIG })
    assert.is_nil(n)
    assert.matches("[4294967296, 4294967296] has more than", why, 1, true)
    assert.are.equal(105, shape.count({ 3, 5, 7 }, 105))
    assert.is_nil(shape.count({ 3, 5, 7 }, 104))
    assert.are.equal(0, shape.count({ 1 << 62, 0, 1 << 62 }, 10))
    assert.are.equal(math.maxinteger, shape.count({ math.maxinteger, 1 }))
    assert.matches("dimension 2 %(%-1%)", select(2, shape.count({ 4, -1 })))
    assert.matches("dimension 1 %(2.5%)", select(2, shape.count({ 2.5 })))
    assert.matches("x: shape %[4294967296, 4294967296%] has more than 1024 values",
      select(2, pcall(shape.check, { BIG, BIG }, 1024, "x")))
  end)
end)

describe("a [2^32, 2^32] tensor with no data", function()
  after_each(H.cleanup)

  it("is refused by the tensor constructors (C: ember_shape_count)", function()
    local ok, err = pcall(ember.tensor_from_bytes, "", BIG, BIG)
    assert.is_false(ok)
    assert.matches("shape [4294967296, 4294967296] must have rows, cols >= 1 and at most 2^32 values", err, 1, true)
    ok, err = pcall(ember.tensor, BIG, BIG)
    assert.is_false(ok)
    assert.matches("at most 2^32 values", err, 1, true)
  end)

  it("as a 128-byte .npy: the vector reader names the file and the shape", function()
    local path = H.tmpdir() .. "/big.npy"
    local bytes = npy_bytes("4294967296, 4294967296")
    assert.are.equal(128, #bytes)
    H.write(path, bytes)
    local ok, err = pcall(require("ember.store.vector_file").read, path .. "@0")
    assert.is_false(ok)
    assert.matches(path, err, 1, true)
    assert.matches("shape (4294967296, 4294967296)", err, 1, true)
  end)

  it("in a safetensors file: load_tensors and the vector reader refuse it", function()
    local path = H.tmpdir() .. "/big.safetensors"
    H.write(path, safetensors_bytes("v", { "4294967296", "4294967296" }, ""))
    local ok, err = pcall(ember.load_tensors, path)
    assert.is_false(ok)
    assert.matches(path, err, 1, true)
    assert.matches("tensor 'v' shape [4294967296, 4294967296] has more than", err, 1, true)
    ok, err = pcall(require("ember.store.vector_file").read, path .. "@0")
    assert.is_false(ok)
    assert.matches("tensor 'v' shape [4294967296, 4294967296]", err, 1, true)
  end)

  it("in an artifact with valid digests: the reader refuses it and compare-artifacts is not 'exact'", function()
    local base = H.tmpdir()
    local a = crafted_artifact(base .. "/a", BIG, BIG, "")
    local b = crafted_artifact(base .. "/b", BIG, BIG, "")
    -- the same craft with a real shape reads fine (so the refusal below is the shape's)
    local good = crafted_artifact(base .. "/good", 1, 2, H.f32({ 1, 2 }))
    assert.are.equal(1, #require("ember.store.artifact").read(good).records)
    local ok, err = pcall(require("ember.store.artifact").read, a)
    assert.is_false(ok)
    assert.matches("artifact '" .. a .. "'", err, 1, true)
    assert.matches("[4294967296, 4294967296]", err, 1, true)
    local code, out, cerr = cli.ember("compare-artifacts", a, b)
    assert.are_not.equal(0, code)
    assert.is_nil(out:match("exact"))
    assert.matches("[4294967296, 4294967296]", cerr, 1, true)
  end)

  it("--steer FILE@0 exits 2 with the reason, in a child process (no signal)", function()
    local model = cli.need_model()
    if not model then return end
    if not fx.exists(fx.build .. "/ember-lua") then return pending("missing " .. fx.build .. "/ember-lua") end
    local dir = H.tmpdir()
    H.write(dir .. "/big.npy", npy_bytes("4294967296, 4294967296"))
    H.write(dir .. "/big.safetensors", safetensors_bytes("v", { "4294967296", "4294967296" }, ""))
    crafted_artifact(dir .. "/art", BIG, BIG, "")
    for _, source in ipairs({ "big.npy@0", "big.safetensors@0", "art#0@0" }) do
      local how, code, err = ember_child("--model", model, "--prompt", "hi", "--max-tokens", "1",
        "--steer", "0:after_layer:" .. dir .. "/" .. source)
      assert.are.equal("exit", how, source .. ": " .. err)
      assert.are.equal(2, code, source .. ": " .. err)
      assert.matches("--steer: ", err, 1, true)
      assert.matches("4294967296, 4294967296", err, 1, true)
    end
  end)
end)
