-- scripts/experiments/logit_lens.lua prints every top token whole, with its id: a model handle
-- whose vocabulary has long pieces (Qwen's '<|reserved_special_token_N|>' kind) and known logits
-- drives the experiment's hooks directly, so the expected table is known without the engine.

local ember = require("ember")

local N_VOCAB, N_LAYERS, K = 40, 3, 3

-- piece(id): long, with a space, a control character, a byte that is no UTF-8 on its own (part
-- of a character) or a whole non-ASCII character in some, as real vocabularies have; shown(id):
-- how the table must print it
local function piece(id)
  if id % 3 == 0 then return "<|reserved_special_token_" .. id .. "|>" end
  if id % 3 == 1 then return " Paris" .. string.rep("x", id) .. "é" end
  return "\n" .. id .. "\xe4"
end
local function shown(id)
  if id % 3 == 2 then return "'\\n" .. id .. "\\xE4'" end
  return "'" .. piece(id) .. "'"
end

-- The logits the handle's unembed gives after layer l: token (7 * l + j) % N_VOCAB has score -j,
-- so the top K are known.
local function lens_logits(l)
  local t = ember.tensor(1, N_VOCAB)
  for v = 1, N_VOCAB do t:set(1, v, -100) end
  for j = 0, N_VOCAB - 1 do
    if j < K + 2 then t:set(1, (7 * l + j) % N_VOCAB + 1, -j) end
  end
  return t
end

local function handle()
  local layer_of = {}
  return {
    info = { n_layers = N_LAYERS, hidden_size = 4, n_vocab = N_VOCAB },
    unembed = function(_, row) return lens_logits(layer_of[row:get(1, 1)]) end,
    detokenize = function(_, ids) return piece(ids[1]) end,
    mark = function(l) layer_of[l + 0.0] = l end,
  }
end

describe("scripts/experiments/logit_lens.lua", function()
  it("prints each top token's id and whole piece (control characters and stray bytes escaped), per layer", function()
    local h = handle()
    local exp = dofile("scripts/experiments/logit_lens.lua")("k=" .. K, h)
    for l = 0, N_LAYERS - 1 do
      h.mark(l)
      local hidden = ember.tensor(2, 4)
      hidden:set(2, 1, l) -- the last row (the default position) names its layer for the stub
      exp:after_layer({ phase = "prefill", start_position = 0, layer_index = l }, hidden)
    end
    local lines = exp:lines()
    assert.are.equal(2 + N_LAYERS, #lines)
    for l = 0, N_LAYERS - 1 do
      local line = lines[2 + l + 1]
      assert.matches("^%s*" .. l .. "%s", line)
      local at = 1
      for j = 0, K - 1 do
        local id = (7 * l + j) % N_VOCAB
        local s, e = line:find(id .. " " .. shown(id), at, true)
        assert.is_truthy(s, string.format("layer %d: token %d %s not in %q", l, id, shown(id), line))
        at = e + 1
      end
    end
  end)

  it("keeps the columns aligned: every row's cells start where the header's do", function()
    local h = handle()
    local exp = dofile("scripts/experiments/logit_lens.lua")("k=" .. K, h)
    for l = 0, N_LAYERS - 1 do
      h.mark(l)
      local hidden = ember.tensor(1, 4)
      hidden:set(1, 1, l)
      exp:after_layer({ phase = "prefill", start_position = 0, layer_index = l }, hidden)
    end
    local lines = exp:lines()
    local starts = {}
    for j = 1, K do starts[j] = lines[2]:find("#" .. j, 1, true) end
    for i = 3, #lines do
      for j = 2, K do
        -- counted in characters (the header is ASCII): the cell's id starts at the header's
        -- column, after a space
        local at = utf8.offset(lines[i], starts[j])
        local c = lines[i]:sub(at, at)
        assert.is_truthy(c:match("%d"), string.format("row %q: column %d does not start at %d", lines[i], j, starts[j]))
        assert.are.equal(" ", lines[i]:sub(at - 1, at - 1))
      end
    end
  end)
end)
