-- ember.model.tokens — the token helpers of ember.Model a TransformerLens user reaches for:
-- m:to_tokens(text), m:to_str_tokens(text | ids), m:to_single_token(text). Built on the model's
-- own tokenize/detokenize; must not tokenize differently from them.

local M = {}

local function fail(fname, msg, ...) error(fname .. ": " .. string.format(msg, ...), 0) end

-- The piece of one token: its text as the model's detokenizer gives it.
local function piece(model, id) return model:detokenize({ id }) end

-- m:to_tokens(text [, { bos = bool }]) -> { ids } (0-based): m:tokenize, BOS as the model adds it
-- by default (TransformerLens's to_tokens with prepend_bos as the tokenizer does).
function M.to_tokens(model, text, opts)
  if type(text) ~= "string" then fail("to_tokens", "expected a string, got %s", type(text)) end
  return model:tokenize(text, opts)
end

-- m:to_str_tokens(text | ids [, { bos = bool }]) -> { pieces }: one string per token, each id's
-- text alone (a piece may hold part of a character); text is tokenized as m:to_tokens does.
function M.to_str_tokens(model, input, opts)
  local ids = input
  if type(input) == "string" then
    ids = model:tokenize(input, opts)
  elseif type(input) ~= "table" then
    fail("to_str_tokens", "expected text or a list of token ids, got %s", type(input))
  end
  local out, n_vocab = {}, model.info.n_vocab
  for i, id in ipairs(ids) do
    if math.type(id) ~= "integer" or id < 0 or id >= n_vocab then
      fail("to_str_tokens", "ids[%d] = %s is not a token id in 0..%d", i, tostring(id), n_vocab - 1)
    end
    out[i] = piece(model, id)
  end
  return out
end

-- m:to_single_token(text) -> id: the one token text is (no BOS), e.g. " Paris"; an error naming
-- the pieces when it is more than one token, or none.
function M.to_single_token(model, text)
  if type(text) ~= "string" then fail("to_single_token", "expected a string, got %s", type(text)) end
  local ids = model:tokenize(text, { bos = false })
  if #ids == 1 then return ids[1] end
  local shown = {}
  for i, id in ipairs(ids) do shown[i] = string.format("%d %q", id, piece(model, id)) end
  fail("to_single_token", "%q is %d tokens, not one%s", text, #ids,
    #ids > 0 and (": " .. table.concat(shown, ", ")) or "")
end

return M
