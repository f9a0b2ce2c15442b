-- The token helpers (m:to_tokens, m:to_str_tokens, m:to_single_token) and `ember tokens`: each
-- agrees with the model's own tokenize/detokenize, token for token, and refuses what is not one
-- token by naming the pieces.

local ember = require("ember")
local cli = require("helpers.cli")
local models = require("helpers.models")

local need_model = models.lazy_default()
local TEXT = "The quick brown fox"

local error_of = require("helpers.errors").error_of

describe("token helpers", function()
  it("to_tokens is tokenize; to_str_tokens gives each token's own text, from text or ids", function()
    local m = need_model()
    if not m then return end
    local ids = m:tokenize(TEXT)
    assert.are.same(ids, m:to_tokens(TEXT))
    assert.are.same(m:tokenize(TEXT, { bos = false }), m:to_tokens(TEXT, { bos = false }))
    local pieces = m:to_str_tokens(TEXT)
    assert.are.equal(#ids, #pieces)
    for i, id in ipairs(ids) do assert.are.equal(m:detokenize({ id }), pieces[i]) end
    assert.are.same(pieces, m:to_str_tokens(ids))
    -- without BOS the pieces spell the text (an ASCII text: no piece splits a character)
    assert.are.equal(TEXT, table.concat(m:to_str_tokens(TEXT, { bos = false })))
    assert.matches("ids%[2%] = %-1 is not a token id", error_of(m.to_str_tokens, m, { 1, -1 }))
  end)

  it("to_single_token gives the id of a one-token text, and names the pieces of any other", function()
    local m = need_model()
    if not m then return end
    local ids = m:tokenize(TEXT, { bos = false })
    local one = m:detokenize({ ids[1] }) -- the first piece of the text is one token
    assert.are.same({ ids[1] }, m:tokenize(one, { bos = false }))
    assert.are.equal(ids[1], m:to_single_token(one))
    local err = error_of(m.to_single_token, m, TEXT)
    assert.matches(string.format("to_single_token: %q is %d tokens, not one: ", TEXT, #ids), err, 1, true)
    assert.matches(string.format("%d %q", ids[2], m:detokenize({ ids[2] })), err, 1, true)
    assert.matches('"" is 0 tokens', error_of(m.to_single_token, m, ""), 1, true)
  end)
end)

describe("ember tokens", function()
  it("prints index, id and piece of every token", function()
    local path = cli.need_model()
    if not path then return end
    local m <close> = ember.load { model = path }
    local code, out, err = cli.ember("tokens", "--model", path, TEXT)
    assert.are.equal(0, code, err)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.matches("^index%s+id%s+piece$", lines[1])
    local ids = m:tokenize(TEXT)
    assert.are.equal(#ids + 1, #lines)
    for i, id in ipairs(ids) do
      local index, got_id, piece = lines[i + 1]:match("^%s*(%d+)%s+(%d+)%s+'(.*)'$")
      assert.are.equal(i - 1, tonumber(index))
      assert.are.equal(id, tonumber(got_id))
      assert.are.equal(m:detokenize({ id }), piece)
    end
    local _, no_bos = cli.ember("tokens", "--model", path, "--no-bos", "--prompt", TEXT)
    local n = select(2, no_bos:gsub("\n", ""))
    assert.are.equal(#m:tokenize(TEXT, { bos = false }) + 1, n)
  end)

  it("shows whitespace and stray bytes visibly, and refuses a missing text", function()
    local path = cli.need_model()
    if not path then return end
    local code, out = cli.ember("tokens", "--model", path, "--no-bos", "a\nb")
    assert.are.equal(0, code)
    assert.matches("'\\n'", out, 1, true)
    local c2, _, err = cli.ember("tokens", "--model", path)
    assert.are.equal(2, c2)
    assert.matches("give the text once", err, 1, true)
  end)
end)
