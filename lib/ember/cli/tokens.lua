-- ember.cli.tokens — `ember tokens --model M "text"`: how the model's tokenizer cuts a text, one
-- line per token (index, id, piece). Must not hold tokenizer logic: it parses flags and prints
-- what m:to_tokens and m:to_str_tokens give.

local flags = require("ember.cli.flags")

local M = {}

local usage_error = flags.usage_error

M.FLAGS_LIST = {
  flags.option("model", "the model whose tokenizer cuts the text (required)"),
  flags.option("tokenizer"),
  { "prompt", "string", "TEXT", "the text (or give it as the argument)" },
  { "no-bos", "bool", nil, "leave out the BOS token the tokenizer adds by default" },
  flags.option("help"),
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.command_usage("usage: ember tokens --model FILE.gguf [--tokenizer FILE] [--no-bos] TEXT", M.FLAGS_LIST, {
      "Prints one line per token: its 0-based index, its id and its piece (quoted; \\n, \\t, other control",
      "bytes and bytes outside UTF-8 as \\xHH). See docs/tokenizers.md." })
end

-- lines(model, text, bos) -> the table's lines (bos nil: the tokenizer's default)
function M.lines(model, text, bos)
  local label = require("ember.analysis.token_label")
  local ids = model:to_tokens(text, bos ~= nil and { bos = bos } or nil)
  local pieces = model:to_str_tokens(ids)
  local w = #tostring(model.info.n_vocab - 1)
  local out = { string.format("%5s  %" .. w .. "s  %s", "index", "id", "piece") }
  for i, id in ipairs(ids) do
    out[#out + 1] = string.format("%5d  %" .. w .. "d  '%s'", i - 1, id, label.printable(pieces[i]))
  end
  return out
end

-- main(args, argv, io_) -> exit code; args[1] is "tokens" (experiments were refused before:
-- ember.cli). Usage errors are raised (ember.cli.flags).
function M.main(args, _, io_)
  local o, pos = flags.command({ name = "tokens", spec = M.FLAGS, usage = M.usage, positionals = true }, args, io_)
  if not o then return 0 end
  if o.model == nil then usage_error("tokens: --model is required") end
  if #pos > 1 then usage_error("tokens: one text, got %d arguments (quote the text)", #pos) end
  if (o.prompt ~= nil) == (#pos == 1) then usage_error("tokens: give the text once, as --prompt TEXT or as TEXT") end
  if not require("ember.store.fs").exists(o.model) then usage_error("--model: cannot open '%s'", o.model) end
  local model = flags.load_model(o, { threads = 1 })
  local bos = nil -- the tokenizer's default
  if o["no-bos"] then bos = false end
  local lines = M.lines(model, o.prompt or pos[1], bos)
  model:close()
  io_.stdout:write(table.concat(lines, "\n"), "\n")
  return 0
end

return M
