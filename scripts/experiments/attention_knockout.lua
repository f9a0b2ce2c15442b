-- attention_knockout.lua — example intervention: no query of the chosen layers may attend to the
-- chosen key positions. Zeroes those columns of attention_pattern for every head (without
-- renormalising the rest, as in the usual knockout), in prefill and every decode step.
-- Must not touch other layers or keys; a key beyond the sequence so far is simply not there yet.
--
-- Use: ember --experiment scripts/experiments/attention_knockout.lua --experiment-args "layers=all keys=0"
--      (layers and keys: lists like 0,2-3 or all: keys=0,5)

local xargs = require("ember.run.experiment_args")

return function(args)
  local who = "attention-knockout"
  local kv = xargs.kv(args, who)
  local layers = xargs.list(kv, "layers", who, "all", "layer")
  local keys = xargs.list(kv, "keys", who, "0", "key position")
  local chosen = {}
  if layers ~= "all" then for _, l in ipairs(layers) do chosen[l] = true end end

  local exp = { name = "attention-knockout", stats = { knocked = 0 } }

  function exp:on_model_loaded(ctx) xargs.check_layers(who, layers, ctx.model.n_layers) end

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
