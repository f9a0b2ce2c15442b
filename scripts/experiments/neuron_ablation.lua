-- neuron_ablation.lua — example intervention: silences chosen MLP neurons of one layer (their
-- columns of mlp_activation, the input of the down projection), in prefill and every decode step.
-- Must not touch other neurons or layers; neurons are 0-based column indices.
--
-- Use: ember --experiment scripts/experiments/neuron_ablation.lua --experiment-args "layer=2 neurons=0-99"
--      (neurons: a list like 0,5-9 or all; quote a list with a comma)

local selectors = require("ember.selectors")

return function(args)
  local kv, err = selectors.parse_kv(type(args) == "string" and args or "")
  if type(args) == "table" then kv, err = args, nil end
  if not kv then error("neuron-ablation: " .. err, 0) end
  local layer, lerr = selectors.parse_uint(tostring(kv.layer))
  if not layer then error("neuron-ablation: layer: " .. lerr, 0) end
  local neurons, nerr = selectors.parse_index_list(tostring(kv.neurons or "all"), "neuron")
  if not neurons then error("neuron-ablation: neurons: " .. nerr, 0) end

  local exp = { name = "neuron-ablation", stats = { ablated = 0, layer = layer } }

  function exp:on_model_loaded(ctx)
    if layer >= ctx.model.n_layers then
      error(string.format("neuron-ablation: layer %d is out of range (0-%d)", layer, ctx.model.n_layers - 1), 0)
    end
  end

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
