-- fuzz/make_artifact_seeds.lua OUT_DIR — seeds for fuzz_artifact: small artifacts written by
-- lib/ember/store/artifact.lua itself (a few records of each kind, 1.1.0 and the older 1.0.0 form), each
-- packed as the harness reads them: 4-byte length, manifest.json, tensors.safetensors.
local artifact = require("ember.store.artifact")
local cjson = require("cjson")

local out = assert(arg[1], "usage: make_artifact_seeds.lua OUT_DIR")

local function f32(values)
  local parts = {}
  for i, v in ipairs(values) do parts[i] = string.pack("<f", v) end
  return table.concat(parts)
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local sections = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/artifact_sections.lua")

local sets = {
  {},
  { { stage = "after_logits", phase = "prefill", start_position = 0, shape = { 1, 4 }, data = f32({ 1, 2, 3, 4 }) } },
  {
    { stage = "after_attention", layer = 0, phase = "prefill", start_position = 0, shape = { 2, 3 },
      data = f32({ 0.5, -1, 2, 0.25, 0, -3.5 }) },
    { stage = "after_mlp", layer = 1, phase = "decode", start_position = 2, shape = { 1, 3 }, data = f32({ 1, 2, 3 }) },
    { stage = "before_logits", phase = "decode", start_position = 2, shape = { 1, 3 }, data = f32({ 4, 5, 6 }) },
  },
}

local tmp = os.tmpname()
os.remove(tmp)
for i, records in ipairs(sets) do
  for _, old in ipairs({ false, true }) do
    local dir = tmp .. "-" .. i .. (old and "-old" or "")
    artifact.write(dir, sections, records)
    local manifest = read(dir .. "/manifest.json")
    if old then -- the 1.0.0 form: no record digests
      local m = cjson.decode(manifest)
      m.schema_version = "1.0.0"
      for _, r in ipairs(m.records) do r.record_sha256 = nil end
      manifest = cjson.encode(m)
    end
    local f = assert(io.open(string.format("%s/seed-%d%s", out, i, old and "-1.0" or ""), "wb"))
    f:write(string.pack("<I4", #manifest), manifest, read(dir .. "/tensors.safetensors"))
    f:close()
    assert(require("ember.store.fs").remove_tree(dir))
  end
end
