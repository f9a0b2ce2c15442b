-- head_ablation.lua — example intervention: zeroes chosen attention heads of one layer (their
-- columns of attention_heads, before the output projection), in prefill and every decode step.
-- Must not touch other heads or layers; heads are 0-based like layers.
--
-- Use: ember --experiment scripts/experiments/head_ablation.lua --experiment-args "layer=1 heads=0,3"
--      (heads: a list like 0,2-3 or all)

local xargs = require("ember.run.experiment_args")

return function(args)
  local who = "head-ablation"
  local kv = xargs.kv(args, who)
  local layer = xargs.uint(kv, "layer", who)
  local heads = xargs.list(kv, "heads", who, "all", "head")

  local exp = { name = "head-ablation", stats = { ablated = 0, layer = layer } }

  function exp:on_model_loaded(ctx) xargs.check_layers(who, layer, ctx.model.n_layers) end

  function exp:attention_heads(ctx, z)
    if ctx.layer_index ~= layer then return end
    local rows, cols = z:shape()[1], z:shape()[2]
    local n_heads = ctx.model.n_heads
    local hd = cols // n_heads
    local list = heads
    if list == "all" then
      list = {}
      for h = 0, n_heads - 1 do list[#list + 1] = h end
    end
    for _, h in ipairs(list) do
      if h >= n_heads then error(string.format("head-ablation: head %d is out of range (0-%d)", h, n_heads - 1), 0) end
      for r = 1, rows do
        for c = h * hd + 1, (h + 1) * hd do z:set(r, c, 0) end
      end
    end
    self.stats.ablated = self.stats.ablated + 1
  end
  return exp
end
