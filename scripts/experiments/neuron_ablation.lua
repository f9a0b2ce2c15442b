-- neuron_ablation.lua — example intervention: silences chosen MLP neurons of one layer (their
-- columns of mlp_activation, the input of the down projection), in prefill and every decode step.
-- Must not touch other neurons or layers; neurons are 0-based column indices.
--
-- Use: ember --experiment scripts/experiments/neuron_ablation.lua --experiment-args "layer=2 neurons=0-99"
--      (neurons: a list like 0,5-9 or all)

local xargs = require("ember.run.experiment_args")

return function(args)
  local who = "neuron-ablation"
  local kv = xargs.kv(args, who)
  local layer = xargs.uint(kv, "layer", who)
  local neurons = xargs.list(kv, "neurons", who, "all", "neuron")

  local exp = { name = "neuron-ablation", stats = { ablated = 0, layer = layer } }

  function exp:on_model_loaded(ctx) xargs.check_layers(who, layer, ctx.model.n_layers) end

  function exp:mlp_activation(ctx, a)
    if ctx.layer_index ~= layer then return end
    if neurons == "all" then
      a:zero()
    else
      local rows, n_ff = a:shape()[1], a:shape()[2]
      for _, j in ipairs(neurons) do
        if j >= n_ff then error(string.format("neuron-ablation: neuron %d is out of range (0-%d)", j, n_ff - 1), 0) end
        for r = 1, rows do a:set(r, j + 1, 0) end
      end
    end
    self.stats.ablated = self.stats.ablated + 1
  end
  return exp
end
