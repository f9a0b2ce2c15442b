-- The engine's descriptor tables as Lua sees them through ember.core: core.FAMILIES against the
-- families docs/models.md documents and against what loading each family reports.

local core = require("ember.core")
local ember = require("ember")
local H = require("helpers.artifacts")
local files = require("helpers.files")

-- The architectures in the first column of docs/models.md's "## Families" table.
local function documented_architectures()
  local text = files.read("docs/models.md")
  local section = text:match("\n## Families\n(.-)\n## ")
  assert(section, "docs/models.md has no '## Families' section")
  local out = {}
  for arch in section:gmatch("\n| `([%w_]+)` |") do out[#out + 1] = arch end
  return out
end

describe("core.FAMILIES", function()
  after_each(H.cleanup)

  it("is an ordered list of rows, each also under its name", function()
    assert.is_true(#core.FAMILIES >= 1)
    for i, row in ipairs(core.FAMILIES) do
      assert.equal("string", type(row.name), "row " .. i)
      assert.equal("boolean", type(row.experimental), row.name)
      assert.is_true(#row.architectures >= 1, row.name)
      assert.equal(row, core.FAMILIES[row.name])
    end
  end)

  it("lists exactly the architectures docs/models.md documents, in its order", function()
    local archs = {}
    for _, row in ipairs(core.FAMILIES) do
      for _, a in ipairs(row.architectures) do archs[#archs + 1] = a end
    end
    assert.are.same(documented_architectures(), archs)
  end)

  it("each family's tiny model loads as that family, experimental as its row says", function()
    local dir = H.tmpdir()
    for _, row in ipairs(core.FAMILIES) do
      local path = dir .. "/" .. row.name .. ".gguf"
      assert.is_true(ember.make_tiny_model(path, { family = row.name, dtype = "f32" }))
      local m = ember.load { model = path, kernels = "reference", threads = 1 }
      assert.equal(row.name, m.info.family)
      assert.equal(row.architectures[1], m.info.architecture)
      assert.equal(row.experimental, m.info.experimental)
      m:close()
    end
  end)

  it("make_tiny_model refuses another family, naming every family it writes", function()
    local ok, err = pcall(ember.make_tiny_model, H.tmpdir() .. "/x.gguf", { family = "mamba9" })
    assert.is_false(ok)
    assert.matches("option 'family' must be one of", err, 1, true)
    for _, row in ipairs(core.FAMILIES) do assert.matches(row.name, err, 1, true) end
  end)
end)
