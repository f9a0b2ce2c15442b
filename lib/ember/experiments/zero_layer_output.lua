-- ember.experiments.zero_layer_output — built-in intervention (SPEC §5): zeroes one layer's
-- attention or MLP contribution, or its finished hidden state, in prefill and every decode step.
-- Must not be quiet about it: it counts every zeroing and says on stderr that the run was modified.
--
-- Use: ember --zero-layer-output 4:mlp ...  or
--      ember --experiment scripts/experiments/zero_layer_output.lua --experiment-args 4:attention
-- args: "LAYER:STAGE" (STAGE attention|mlp|layer) or { layer = n, stage = "mlp", notice = fn }.

local selectors = require("ember.run.selectors")

return function(args)
  local notice = function(msg) io.stderr:write(msg, "\n") end
  local target
  if type(args) == "table" then
    notice = args.notice or notice
    target = args.target
    if target == nil and args.layer ~= nil then
      if args.stage == nil then
        error("zero-layer-output: layer= needs stage= beside it (attention|mlp|layer): --experiment-args "
          .. "'layer=" .. tostring(args.layer) .. " stage=mlp' or '" .. tostring(args.layer) .. ":mlp'", 0)
      end
      target = string.format("%s:%s", args.layer, args.stage)
    end
  else
    target = args
  end
  local t, err = selectors.parse_layer_stage(target, "zero")
  if not t then error("zero-layer-output: " .. err, 0) end

  local exp = { name = "zero-layer-output", target = t,
    stats = { interventions = 0, prefill = 0, decode = 0, layer = t.layer, stage = t.stage } }
  local L, stats = t.layer, exp.stats

  -- Checked again here (the CLI checks before loading the session) so that a script using this
  -- factory directly also refuses a layer the model does not have, before anything runs.
  function exp:on_model_loaded(ctx)
    local n = ctx.model.n_layers
    if L >= n then
      error(string.format("zero-layer-output: layer %d is out of range (the model has %d layers: 0-%d)", L, n,
        n - 1), 0)
    end
  end

  exp[t.stage] = function(_, ctx, view)
    if ctx.layer_index ~= L then return end
    view:zero()
    stats.interventions = stats.interventions + 1
    stats[ctx.phase] = stats[ctx.phase] + 1
  end

  function exp:on_generation_complete()
    notice(string.format("ember: this run was MODIFIED by zero-layer-output %d:%s: %s of layer %d zeroed "
      .. "in %d evaluations (prefill %d, decode %d)", L, t.short, t.stage, L, stats.interventions,
      stats.prefill, stats.decode))
  end
  return exp
end
