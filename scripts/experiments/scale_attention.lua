-- scale_attention.lua — example intervention: multiplies one layer's attention contribution
-- (after_attention, before the residual add) by a factor, in prefill and every decode step.
-- Must not touch other layers; factor=1 leaves the run bit-identical (x * 1.0 == x in f32).
--
-- Use: ember --experiment scripts/experiments/scale_attention.lua --experiment-args "layer=3 factor=0.5"

local selectors = require("ember.run.selectors")

return function(args)
  local kv, err = selectors.parse_kv(type(args) == "string" and args or "")
  if type(args) == "table" then kv, err = args, nil end
  if not kv then error("scale-attention: " .. err, 0) end
  local layer, lerr = selectors.parse_uint(tostring(kv.layer))
  if not layer then error("scale-attention: layer: " .. lerr, 0) end
  local factor, ferr = selectors.parse_float(tostring(kv.factor))
  if not factor then error("scale-attention: factor: " .. ferr, 0) end

  local exp = { name = "scale-attention", stats = { scaled = 0, layer = layer, factor = factor } }

  function exp:on_model_loaded(ctx)
    if layer >= ctx.model.n_layers then
      error(string.format("scale-attention: layer %d is out of range (0-%d)", layer, ctx.model.n_layers - 1), 0)
    end
  end

  function exp:after_attention(ctx, attn_out)
    if ctx.layer_index ~= layer then return end
    attn_out:scale(factor)
    self.stats.scaled = self.stats.scaled + 1
  end
  return exp
end
