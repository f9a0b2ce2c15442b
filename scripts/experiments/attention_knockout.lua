-- attention_knockout.lua — example intervention: no query of the chosen layers may attend to the
-- chosen key positions. Zeroes those columns of attention_pattern for every head (without
-- renormalising the rest, as in the usual knockout), in prefill and every decode step.
-- Must not touch other layers or keys; a key beyond the sequence so far is simply not there yet.
--
-- Use: ember --experiment scripts/experiments/attention_knockout.lua --experiment-args "layers=all keys=0"
--      (layers and keys: lists like 0,2-3 or all; quote a list with a comma: keys='0,5')

local selectors = require("ember.selectors")

return function(args)
  local kv, err = selectors.parse_kv(type(args) == "string" and args or "")
  if type(args) == "table" then kv, err = args, nil end
  if not kv then error("attention-knockout: " .. err, 0) end
  local layers, lerr = selectors.parse_index_list(tostring(kv.layers or "all"), "layer")
  if not layers then error("attention-knockout: layers: " .. lerr, 0) end
  local keys, kerr = selectors.parse_index_list(tostring(kv.keys or "0"), "key position")
  if not keys then error("attention-knockout: keys: " .. kerr, 0) end
  local chosen = {}
  if layers ~= "all" then for _, l in ipairs(layers) do chosen[l] = true end end

  local exp = { name = "attention-knockout", stats = { knocked = 0 } }

  function exp:on_model_loaded(ctx)
    if layers == "all" then return end
    for _, l in ipairs(layers) do
      if l >= ctx.model.n_layers then
        error(string.format("attention-knockout: layer %d is out of range (0-%d)", l, ctx.model.n_layers - 1), 0)
      end
    end
  end

  -- p: [n_heads * rows, sequence_length]; column j + 1 is key position j for every row.
  function exp:attention_pattern(ctx, p)
    if layers ~= "all" and not chosen[ctx.layer_index] then return end
    local rows, n_keys = p:shape()[1], p:shape()[2]
    for r = 1, rows do
      if keys == "all" then
        p:row(r):zero()
      else
        for _, j in ipairs(keys) do
          if j < n_keys then p:set(r, j + 1, 0) end
        end
      end
    end
    self.stats.knocked = self.stats.knocked + 1
  end
  return exp
end
