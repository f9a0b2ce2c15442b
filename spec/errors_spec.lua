-- User-facing errors carry no position inside lib/ember, and option lists come from the table
-- that defines the options (ember.LOAD_OPTIONS for ember.load).

local ember = require("ember")
local C = require("helpers.cli")

local function lib_position(msg) return msg:find("lib/ember/[%w_/]+%.lua:%d+:") or msg:find("init%.lua:%d+:") end

describe("error messages", function()
  it("ember.load names the problem, not a library line", function()
    local cases = {
      { { model = "nope.gguf" }, "^load: nope.gguf: cannot open" },
      { "nope.gguf", "^load: nope.gguf: cannot open" },
      { { model = "m.gguf", kernel = "avx2" },
        "^bad argument to 'load' %(unknown option 'kernel', did you mean 'kernels'%?" },
      { { model = "nope.gguf", tokenizer = 3 }, "^bad argument #1 to 'load' %(option 'tokenizer' must be" },
      { 42, "^bad argument #1 to 'load' %(table of options or model path expected, got number%)" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(ember.load, c[1])
      assert.is_false(ok)
      assert.is_truthy(err:match(c[2]), err)
      assert.is_falsy(lib_position(err), err)
    end
  end)

  it("the unknown-option list of ember.load is ember.LOAD_OPTIONS, tokenizer included", function()
    local _, err = pcall(ember.load, { model = "m.gguf", tokenizr = "t.json" })
    assert.is_truthy(err:find("did you mean 'tokenizer'?", 1, true), err)
    assert.is_truthy(err:find("valid: " .. table.concat(ember.LOAD_OPTIONS, ", ") .. ")", 1, true), err)
    for _, k in ipairs({ "model", "tokenizer", "arch", "kernels", "threads" }) do
      assert.is_truthy(err:find(k, 1, true), k)
    end
  end)

  it("a script's own call is where the error points", function()
    local f = os.tmpname()
    local h = assert(io.open(f, "wb"))
    h:write("local ember = require('ember')\n\nember.load('nope.gguf')\n")
    h:close()
    local chunk = assert(loadfile(f))
    local ok, err = pcall(chunk)
    os.remove(f)
    assert.is_false(ok)
    assert.is_truthy(err:find(f .. ":3: load: nope.gguf: cannot open", 1, true), err)
  end)

  it("the ember command prints them without positions", function()
    local code, _, err = C.ember("--model", "nope.gguf", "--prompt", "x")
    assert.are.equal(1, code)
    assert.is_truthy(err:find("ember: load: nope.gguf: cannot open", 1, true), err)
    assert.is_falsy(lib_position(err), err)
    code, _, err = C.ember("--model", "nope.gguf", "--prompt", "x", "--tokenizer", "nope.json")
    assert.are.equal(1, code)
    assert.is_falsy(lib_position(err), err)
  end)
end)
