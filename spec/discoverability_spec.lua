-- Finding one's way: a misspelt method of any ember class says which one was meant, m:tensors()
-- lists what the GGUF file holds (checked against the file's own bytes, helpers.gguf), help works
-- outside the REPL and shows a model's tensors, and the REPL completes through indexing.

local ember = require("ember")
local gguf = require("helpers.gguf")
local models = require("helpers.models")
local repl = require("ember.cli.repl")

local need_model = models.lazy_default()

local error_of = require("helpers.errors").error_of

describe("a misspelt method", function()
  it("names the method meant, on every class; other keys still read as nil", function()
    local m = need_model()
    if not m then return end
    local s <close> = m:session { context = 8 }
    local t = ember.tensor(2, 2)
    local cases = {
      { function() return m:sesion {} end, "ember.Model has no method or property 'sesion' (did you mean 'session'?)" },
      { function() return m.Info end, "did you mean 'info'" },
      { function() return s:prefil({ 1 }) end,
        "ember.Session has no method or property 'prefil' (did you mean 'prefill'?)" },
      { function() return t:clone_() end, "(did you mean 'clone'?)" },
      { function() return m.tokenizer:encod("a") end, "(did you mean 'encode'?)" },
      { function() return m:run_with_cache { ids = { 1 } }:stak("after_layer") end, "(did you mean 'stack'?)" },
    }
    for _, c in ipairs(cases) do assert.matches(c[2], error_of(c[1]), 1, true) end
    assert.is_nil(m.no_such_thing)
    assert.is_nil(t.whatever_else)
  end)
end)

describe("m:tensors()", function()
  it("lists every tensor of the file with its type, shape and stored bytes, in the file's order", function()
    local m = need_model()
    if not m then return end
    local g = gguf.open(m.info.path)
    local TYPE = { [0] = "f32", [1] = "f16", [8] = "q8_0", [30] = "bf16" }
    local BLOCK = { [0] = { 1, 4 }, [1] = { 1, 2 }, [8] = { 32, 34 }, [30] = { 1, 2 } } -- values, bytes
    local list = m:tensors()
    assert.are.equal(#g.names, #list)
    for i, name in ipairs(g.names) do
      local t = g.tensors[name]
      local shape = {}
      local count = 1
      for d = #t.dims, 1, -1 do
        shape[#shape + 1] = t.dims[d] -- outermost first
        count = count * t.dims[d]
      end
      local bytes = count // BLOCK[t.type][1] * BLOCK[t.type][2]
      assert.are.same({ name = name, type = TYPE[t.type], shape = shape, bytes = bytes }, list[i])
    end
  end)

  it("m:weight(name, rows) gives those rows of the whole tensor, and refuses a row out of range", function()
    local m = need_model()
    if not m then return end
    local whole, some = m:weight("output"), m:weight("output", { 5, 0, 511 })
    assert.are.same({ 3, m.info.hidden_size }, some:shape())
    for i, r in ipairs({ 5, 0, 511 }) do assert.are.equal(whole:row(r + 1):sha256(), some:row(i):sha256()) end
    assert.matches("weight: row 512 of 'output' out of range 0..511", error_of(m.weight, m, "output", { 1, 512 }))
  end)
end)

describe("help", function()
  local function ember_lua(code)
    local p = io.popen("build/ember-lua -e " .. require("helpers.artifacts").shell_quote(code) .. " 2>&1")
    local out = p:read("a")
    return p:close(), out
  end

  it("works outside the REPL (ember-lua -e 'help(ember)') and shows a model's tensors", function()
    local path = models.default_model()
    if not path then return pending("no default model") end
    local ok, out = ember_lua("help(ember)")
    assert.is_true(ok, out)
    assert.matches("the functions of the ember module", out, 1, true)
    assert.matches("ember.act_name(name [, layer])", out, 1, true)
    ok, out = ember_lua("help(ember.load('" .. path .. "'))")
    assert.is_true(ok, out)
    assert.matches("m:tensors() -> ", out, 1, true)
    assert.matches("tensors (m:tensors(): ", out, 1, true)
    assert.matches("token_embd.weight%s+q8_0%s+%[512, 64%]", out)
  end)
end)

describe("REPL completion", function()
  it("goes through indexing (c.after_layer[3]:l2) and keeps completing after an open '['", function()
    local m = need_model()
    if not m then return end
    local env = { c = m:run_with_cache { ids = { 1, 2 }, stages = { "after_layer" } }, t = { 1 }, index = 1 }
    assert.are.same({ "c.after_layer[3]:l2_norm" }, repl.complete("c.after_layer[3]:l2", env))
    assert.are.same({ "c:stack", "c:stack_head_results" }, repl.complete("c:stac", env))
    assert.are.same({ "t[index" }, repl.complete("t[ind", env))
    assert.are.same({}, repl.complete("c.after_layer[9]:l2", env)) -- no layer 9: nothing to offer
  end)

  it("prints a cache and its layers from 0", function()
    local m = need_model()
    if not m then return end
    local c = m:run_with_cache { ids = { 1, 2 }, stages = { "after_layer" } }
    local text = repl.format(c)
    assert.matches("after_layer%s+layers 0%-" .. (m.info.n_layers - 1), text)
    assert.matches("^after_layer: layers 0%-" .. (m.info.n_layers - 1), repl.format(c.after_layer))
  end)
end)
