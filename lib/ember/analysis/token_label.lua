-- ember.analysis.token_label — how text from a tokenizer or a file is shown in figures, tics, titles and
-- manifests: valid UTF-8 kept, whitespace tokens made visible (␣, \n, \t), every other control
-- byte and every byte outside valid UTF-8 written as \xHH. Must not tokenize, cut or lay out text
-- (a model is only asked for a token's text).

local M = {}

local NAMED = { ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r" }

-- The length of the UTF-8 sequence that byte `b` opens (nil: `b` opens none).
local function seq_len(b)
  if b < 0x80 then return 1 end
  if b >= 0xC2 and b <= 0xDF then return 2 end
  if b >= 0xE0 and b <= 0xEF then return 3 end
  if b >= 0xF0 and b <= 0xF4 then return 4 end
  return nil
end

local function escape_byte(c) return NAMED[c] or string.format("\\x%02X", c:byte()) end

-- printable(s) -> s with no control byte (0x00-0x1F, 0x7F) and no invalid UTF-8 left: \n, \t, \r
-- are written as those two characters, every other such byte as \xHH. Spaces stay spaces.
function M.printable(s)
  s = tostring(s)
  local out, i, n = {}, 1, #s
  while i <= n do
    local b = s:byte(i)
    local len = seq_len(b)
    local ch = len and s:sub(i, i + len - 1)
    -- utf8.len refuses overlong forms, surrogates and code points past U+10FFFF
    if ch and #ch == len and utf8.len(ch) == 1 and not (b < 0x20 or b == 0x7F) then
      out[#out + 1] = ch
      i = i + len
    else
      out[#out + 1] = escape_byte(s:sub(i, i))
      i = i + 1
    end
  end
  return table.concat(out)
end

-- is_printable(s) -> true when printable(s) would leave s unchanged (what a label read from disk
-- must be)
function M.is_printable(s) return type(s) == "string" and M.printable(s) == s end

-- visible(piece) -> a token's text as a label: printable(), with spaces as ␣ (U+2423), so a
-- whitespace token is never an empty-looking tic.
function M.visible(piece)
  return (M.printable(piece):gsub(" ", "\u{2423}"))
end

-- token(model, id) -> the label of one token id (0-based): its text made visible, or <id> for a
-- token with no text (BOS and other special tokens)
function M.token(model, id)
  local s = M.visible(model:detokenize({ id }))
  return s ~= "" and s or ("<" .. id .. ">")
end

-- positions(model, ids) -> { "0 piece", "1 piece", ... }: tics for a sequence of tokens
function M.positions(model, ids)
  local out = {}
  for i, id in ipairs(ids) do out[i] = string.format("%d %s", i - 1, M.token(model, id)) end
  return out
end

return M
