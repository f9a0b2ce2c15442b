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

-- The stages in the rows of docs/hooks.md's lifecycle table: the hooks given a view (ctx, v).
local function documented_stages()
  local out = {}
  for name in files.read("docs/hooks.md"):gmatch("\n| [%a ]+ | `([%w_]+)%(ctx, [%w_]+%)` |") do
    out[#out + 1] = name
  end
  return out
end

describe("core.STAGES", function()
  after_each(H.cleanup)

  it("is the table of the stages core.stages lists, each row also under its name", function()
    local SPELLINGS = { rows = { tokens = true, last = true, ["heads*tokens"] = true },
      width = { hidden = true, n_ff = true, ["heads*head_dim"] = true, vocab = true, pattern = true, d_sae = true,
        n_experts = true },
      heads = { none = true, rows = true, columns = true } }
    assert.equal(#core.stages, #core.STAGES)
    for i, row in ipairs(core.STAGES) do
      assert.equal(core.stages[i], row.name)
      assert.equal(row, core.STAGES[row.name])
      if i > 1 then assert.is_true(core.STAGES[i - 1].order < row.order, row.name) end
      assert.equal(core.layer_stages[row.name] ~= nil, row.in_layer and not row.sae_only, row.name)
      assert.equal(core.sae_stages[row.name] ~= nil, row.sae_only, row.name)
      assert.equal(core.inside_stages[row.name] ~= nil, row.inside_block, row.name)
      for field, allowed in pairs(SPELLINGS) do assert.is_true(allowed[row[field]], row.name .. "." .. field) end
    end
  end)

  it("lists the stages docs/hooks.md documents, in its order", function()
    local names = {}
    for i, row in ipairs(core.STAGES) do names[i] = row.name end
    assert.are.same(documented_stages(), names)
  end)

  it("says what each stage's view holds on a model", function()
    local path = H.tmpdir() .. "/m.gguf"
    assert.is_true(ember.make_tiny_model(path, { family = "llama", dtype = "f32" }))
    local m = ember.load { model = path, kernels = "reference", threads = 1 }
    local info = m.info
    local n_ff = m:weight("blk.0.ffn_down"):shape()[2] -- [hidden, n_ff]
    local exp, seen = { name = "shapes" }, {}
    local pass = {} -- the stages a forward pass calls by itself (not an SAE splice's)
    for _, row in ipairs(core.STAGES) do -- (moe_router: the MoE families' only, spec/moe_spec.lua)
      if not row.sae_only and (not row.families or row.families.llama) then pass[#pass + 1] = row end
    end
    for _, row in ipairs(pass) do
      exp[row.name] = function(_, ctx, v)
        local n = ctx.input_token_count
        local rows = ({ tokens = n, last = 1, ["heads*tokens"] = info.n_heads * n })[row.rows]
        local width = ({ hidden = info.hidden_size, n_ff = n_ff, ["heads*head_dim"] = info.n_heads * info.head_dim,
          vocab = info.n_vocab, pattern = ctx.sequence_length })[row.width]
        assert.are.same({ rows, width }, v:shape(), row.name)
        assert.equal(row.in_layer, ctx.layer_index ~= nil, row.name)
        seen[row.name] = true
      end
    end
    m:generate { prompt = "a b", max_tokens = 2, experiment = exp }
    for _, row in ipairs(pass) do assert.is_true(seen[row.name], row.name) end
    m:close()
  end)
end)

describe("core.KERNEL_SETS", function()
  it("lists the sets of core.kernel_sets with the CPU features each requires", function()
    local cpu = core.cpu()
    assert.equal(#core.kernel_sets, #core.KERNEL_SETS)
    local best
    for i, row in ipairs(core.KERNEL_SETS) do
      assert.equal(core.kernel_sets[i], row.name)
      assert.equal(row, core.KERNEL_SETS[row.name])
      local runs = true
      for _, f in ipairs(row.requires) do
        assert.equal("boolean", type(cpu[f]), row.name .. " requires '" .. f .. "', which ember.cpu() does not report")
        runs = runs and cpu[f]
      end
      if row.name ~= "auto" and runs then best = row.name end -- the sets are in order of preference
    end
    assert.are.same({}, core.KERNEL_SETS.reference.requires)
    assert.equal(best, cpu.kernels) -- the set auto picks is the last one this CPU has every feature of
  end)
end)
