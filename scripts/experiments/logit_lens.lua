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

  local function piece(id)
    local s = model:detokenize({ id })
    s = s:gsub("[%c]", function(c) return string.format("\\x%02x", c:byte()) end)
    if #s > 12 then s = s:sub(1, 11) .. "~" end
    return "'" .. s .. "'"
  end

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

  -- lines() -> the table: one line per layer, the top-k tokens and softmax probabilities
  function exp:lines()
    local out = { string.format("logit lens: top %d tokens after each layer at position %s", k, tostring(at)) }
    local head = { string.format("%5s", "layer") }
    for j = 1, k do head[#head + 1] = string.format("%-22s", "#" .. j) end
    out[#out + 1] = table.concat(head, "  ")
    local top, layers = self:top(), {}
    for l in pairs(top) do layers[#layers + 1] = l end
    table.sort(layers)
    for _, l in ipairs(layers) do
      local ids, values = top[l].ids, top[l].probs
      local cells = { string.format("%5d", l) }
      for j = 1, #ids do cells[#cells + 1] = string.format("%-14s %7.4f", piece(ids[j]), values[j]) end
      out[#out + 1] = table.concat(cells, "  ")
    end
    return out
  end

  function exp:on_generation_complete()
    io.stderr:write(table.concat(self:lines(), "\n"), "\n")
  end
  return exp
end
