-- ember.save_tensors / ember.load_tensors: named tensors in a safetensors file. The file is read
-- back here independently (header length, JSON header through cjson, raw f32 bytes) and through
-- load_tensors; damaged files are refused by the same header checks the artifact reader uses.

local ember = require("ember")
local cjson = require("cjson")
local H = require("helpers.artifacts")

local read = require("helpers.files").read

describe("save_tensors / load_tensors", function()
  after_each(H.cleanup)

  it("writes standard safetensors: F32, [rows, cols], offsets in name order, the raw bytes", function()
    local dir = H.tmpdir()
    local v = ember.tensor(1, 4, { 0.5, -1, 2, 1e-3 })
    local w = ember.tensor(2, 3, { { 1, 2, 3 }, { 4, 5, 6 } })
    assert.is_true(ember.save_tensors(dir .. "/t.safetensors", { steer = v, probe = w }, { note = "layer 2" }))
    local blob = read(dir .. "/t.safetensors")
    local n = string.unpack("<I8", blob)
    local header = cjson.decode(blob:sub(9, 8 + n))
    assert.are.same({ note = "layer 2" }, header.__metadata__)
    assert.are.same({ dtype = "F32", shape = { 2, 3 }, data_offsets = { 0, 24 } }, header.probe)
    assert.are.same({ dtype = "F32", shape = { 1, 4 }, data_offsets = { 24, 40 } }, header.steer)
    local data = blob:sub(9 + n)
    assert.are.equal(w:bytes() .. v:bytes(), data)
    assert.are.equal(0, (8 + n) % 8) -- the buffer starts 8-aligned
  end)

  it("round-trips the values bit for bit, with the metadata, and the same input gives the same bytes", function()
    local dir = H.tmpdir()
    local t = ember.tensor(3, 5)
    for r = 1, 3 do for c = 1, 5 do t:set(r, c, (r * 7 + c) / 3 - 2.5) end end
    local one = ember.tensor(1, 1, { -0.0 })
    ember.save_tensors(dir .. "/a.st", { t = t, one = one }, { k = "v" })
    local got, meta = ember.load_tensors(dir .. "/a.st")
    assert.are.same({ k = "v" }, meta)
    assert.are.equal(t:sha256(), got.t:sha256())
    assert.are.same({ 3, 5 }, got.t:shape())
    assert.are.equal(one:bytes(), got.one:bytes())
    ember.save_tensors(dir .. "/b.st", { one = one, t = t }, { k = "v" })
    assert.are.equal(read(dir .. "/a.st"), read(dir .. "/b.st"))
  end)

  it("saves a view inside a hook (its values at that moment)", function()
    local path = require("helpers.fixtures").api_model()
    if not path then return pending("no model") end
    local model = ember.load { model = path, kernels = "reference" }
    local dir, kept = H.tmpdir(), nil
    local exp = { name = "keep" }
    function exp:after_layer(ctx, h)
      if ctx.layer_index == 1 then
        ember.save_tensors(dir .. "/h.st", { h = h:row(h:shape()[1]) })
        kept = h:row(h:shape()[1]):clone()
      end
    end
    model:session { context = 16 }:prefill({ 1, 2, 3 }, { experiment = exp })
    assert.are.equal(kept:sha256(), ember.load_tensors(dir .. "/h.st").h:sha256())
    model:close()
  end)

  it("refuses bad arguments, and damaged files with the artifact reader's checks, naming the file", function()
    local dir = H.tmpdir()
    local t = ember.tensor(1, 2, { 1, 2 })
    assert.has_error(function() ember.save_tensors(dir .. "/x", { t = 5 }) end,
      "bad argument #2 to 'save_tensors' ('t' is a number, not an ember.Tensor)")
    assert.has_error(function() ember.save_tensors(dir .. "/x", { [1] = t }) end)
    assert.has_error(function() ember.save_tensors(dir .. "/x", { __metadata__ = t }) end)
    assert.has_error(function() ember.save_tensors(dir .. "/x", { t = t }, { n = 1 }) end,
      "bad argument #3 to 'save_tensors' (metadata must map strings to strings)")
    local ok, err = pcall(ember.save_tensors, dir .. "/no/such/dir/x", { t = t })
    assert.is_false(ok)
    assert.is_truthy(err:find("save_tensors", 1, true), err)

    local good = dir .. "/good.st"
    ember.save_tensors(good, { t = t })
    local blob = read(good)
    local function damaged(bytes, want)
      local p = dir .. "/bad.st"
      H.write(p, bytes)
      local okl, e = pcall(ember.load_tensors, p)
      assert.is_false(okl)
      assert.is_truthy(e:find("load_tensors: " .. p .. ": ", 1, true), e)
      assert.is_truthy(e:find(want, 1, true), e)
    end
    damaged(blob:sub(1, 5), "file too short")
    damaged(string.pack("<I8", 1e9) .. blob:sub(9), "does not fit the file")
    damaged(blob:sub(1, -2), "outside the")
    damaged(blob .. "xx", "bytes after the last tensor")
    ok, err = pcall(ember.load_tensors, dir .. "/missing.st")
    assert.is_false(ok)
    assert.is_truthy(err:find("missing.st", 1, true), err)
    -- an atomic write: no temporary file is left beside the result
    assert.are.same({ "bad.st", "good.st" }, H.listdir(dir))
  end)
end)
