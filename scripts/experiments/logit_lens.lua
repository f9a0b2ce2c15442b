-- logit_lens.lua — example observation: the logit lens. Reads the residual stream after every
-- layer at one position, puts it through the model's own final norm and LM head (model:unembed)
-- and prints, per layer, the top-k next tokens with their probabilities. Must not write a view:
-- the run's logits and ids stay bit-identical to a run without it.
--
-- Use: ember --experiment scripts/experiments/logit_lens.lua --experiment-args "k=5" --prompt ...
-- args: k (tokens per layer, default 5); position (0-based prompt position, default the last one:
-- the prompt's next-token prediction). The table goes to stderr when the generation completes;
-- exp:lines() gives it as a list of strings and exp:top() as numbers (in a session, where no
-- completion is signalled).

local token_label = require("ember.analysis.token_label")
local xargs = require("ember.run.experiment_args")

return function(args, model)
  local who = "logit-lens"
  local kv = xargs.kv(args, who)
  local k = xargs.uint(kv, "k", who, 5)
  if k < 1 then error("logit-lens: k must be at least 1", 0) end
  local position = kv.position ~= nil and xargs.uint(kv, "position", who) or nil
  if not (model and model.unembed) then
    error("logit-lens: needs the model (run it with --experiment, or call the factory as factory(args, model))", 0)
  end

  local exp = { name = "logit-lens", stats = { layers = 0 } }
  local rows = {} -- layer -> the residual row, [1, hidden] (a copy taken in the hook)
  local at       -- the absolute position read

  function exp:after_layer(ctx, hidden)
    if ctx.phase ~= "prefill" then return end
    local n = hidden:shape()[1]
    local p = position or (n - 1)
    if p >= n then error(string.format("logit-lens: position %d is beyond the prompt (0-%d)", p, n - 1), 0) end
    at = ctx.start_position + p
    rows[ctx.layer_index] = hidden:row(p + 1):clone()
    self.stats.layers = self.stats.layers + 1
  end

  -- The token's piece whole and quoted, as every figure and table shows text (token_label:
  -- \n, \t, other control bytes and bytes that are not UTF-8 as \xHH): a cut piece could not be
  -- told apart.
  local function piece(id) return "'" .. token_label.printable(model:detokenize({ id })) .. "'" end

  -- Display width: characters (a printable piece is valid UTF-8).
  local function width(s) return utf8.len(s) or #s end
  local function pad(s, w) return s .. string.rep(" ", w - width(s)) end

  -- top() -> { [layer] = { ids = {...}, probs = {...} } }: the top-k token ids (0-based) and their
  -- softmax probabilities, best first, per layer read
  function exp:top()
    local t = {}
    for l, row in pairs(rows) do
      local ids, probs = model:unembed(row):softmax():topk(k)
      t[l] = { ids = ids, probs = probs }
    end
    return t
  end

  -- lines() -> the table: one line per layer, each of the top-k cells "id 'piece' probability",
  -- columns as wide as their widest cell
  function exp:lines()
    local top, layers = self:top(), {}
    for l in pairs(top) do layers[#layers + 1] = l end
    table.sort(layers)
    local cells, widths = {}, {}
    for j = 1, k do widths[j] = width("#" .. j) end
    for i, l in ipairs(layers) do
      local ids, values = top[l].ids, top[l].probs
      cells[i] = {}
      for j = 1, #ids do
        local c = string.format("%d %s %.4f", ids[j], piece(ids[j]), values[j])
        cells[i][j] = c
        if width(c) > widths[j] then widths[j] = width(c) end
      end
    end
    local out = { string.format("logit lens: top %d tokens after each layer at position %s (id 'piece' probability)",
      k, tostring(at)) }
    local head = { string.format("%5s", "layer") }
    for j = 1, k do head[#head + 1] = pad("#" .. j, widths[j]) end
    out[#out + 1] = (table.concat(head, "  "):gsub("%s+$", ""))
    for i, l in ipairs(layers) do
      local row = { string.format("%5d", l) }
      for j = 1, #cells[i] do row[#row + 1] = pad(cells[i][j], widths[j]) end
      out[#out + 1] = (table.concat(row, "  "):gsub("%s+$", ""))
    end
    return out
  end

  function exp:on_generation_complete()
    io.stderr:write(table.concat(self:lines(), "\n"), "\n")
  end
  return exp
end
