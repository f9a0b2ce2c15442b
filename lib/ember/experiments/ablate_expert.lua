-- ember.experiments.ablate_expert — built-in intervention for mixture-of-experts models: bans
-- experts from their layer's routing (the moe_router logit set to -inf before the softmax and top-k,
-- so the layer picks its k experts among the others and renormalises their weights), in prefill and
-- every decode step. Must not be quiet about it: it counts the banned rows and says on stderr that
-- the run was modified.
--
-- Use: ember --ablate-expert 3:17 --ablate-expert 3:40 ...  or
--      ember.experiments.ablate_expert{ targets = { { layer = 3, expert = 17 } }, notice = fn }
-- args: { targets = { {layer =, expert =}, ... }, notice = fn } or "L:E".

local selectors = require("ember.run.selectors")

return function(args)
  local notice = function(msg) io.stderr:write(msg, "\n") end
  local targets = {}
  if type(args) == "table" then
    notice = args.notice or notice
    targets = args.targets or {}
  else
    local t, err = selectors.parse_layer_expert(args)
    if not t then error("ablate-expert: " .. err, 0) end
    targets = { t }
  end
  if #targets == 0 then error("ablate-expert: no LAYER:EXPERT given", 0) end
  local by_layer = {}
  for _, t in ipairs(targets) do
    by_layer[t.layer] = by_layer[t.layer] or {}
    table.insert(by_layer[t.layer], t.expert)
  end
  local exp = { name = "ablate-expert", targets = targets, stats = { interventions = 0, prefill = 0, decode = 0 } }
  local stats = exp.stats

  function exp:on_model_loaded(ctx)
    local n = ctx.model.n_layers
    for _, t in ipairs(targets) do
      if t.layer >= n then
        error(string.format("ablate-expert: layer %d is out of range (the model has %d layers: 0-%d)", t.layer, n,
          n - 1), 0)
      end
    end
  end

  function exp:moe_router(ctx, view)
    local experts = by_layer[ctx.layer_index]
    if not experts then return end
    local rows, cols = table.unpack(view:shape())
    for _, e in ipairs(experts) do
      if e >= cols then
        error(string.format("ablate-expert: expert %d is out of range (layer %d has %d experts: 0-%d)", e,
          ctx.layer_index, cols, cols - 1), 0)
      end
      for r = 1, rows do view:set(r, e + 1, -math.huge) end
    end
    stats.interventions = stats.interventions + 1
    stats[ctx.phase] = stats[ctx.phase] + 1
  end

  function exp:on_generation_complete()
    local text = {}
    for i, t in ipairs(targets) do text[i] = string.format("%d:%d", t.layer, t.expert) end
    notice(string.format("ember: this run was MODIFIED by ablate-expert %s: experts banned from their layer's "
      .. "routing in %d evaluations of a layer (prefill %d, decode %d)", table.concat(text, ","),
      stats.interventions, stats.prefill, stats.decode))
  end
  return exp
end
