-- ember.experiments.activation_stats — built-in observation experiment (SPEC §5): at every tensor
-- hook it records where it is and what the activation looks like (L2 norm, max |x|, fingerprint).
-- Must not write to any view: the run's logits and ids stay bit-identical to a run without it.
--
-- Use: ember --activation-stats stats.json [--capture-stages LIST] ...  or
--      ember --experiment scripts/experiments/activation_stats.lua --experiment-args "output=stats.json"
-- Stages: the residual-stream ones unless `stages` names others ("all", or a list such as
-- "attention_pattern,mlp_activation").
-- The JSON is written when the generation completes, atomically, keys in a fixed order.

local json = require("ember.store.json")
local fs = require("ember.store.fs")
local selectors = require("ember.run.selectors")

local RECORD_KEYS = { "phase", "stage", "layer_index", "sequence_length", "start_position", "token_range",
  "shape", "dtype", "l2_norm", "abs_max", "fingerprint" }

-- to_json(records) -> the activation-stats document text (stable, jq-friendly).
local function to_json(records)
  local out = json.array()
  for i, r in ipairs(records) do
    out[i] = json.ordered(RECORD_KEYS, {
      phase = r.phase, stage = r.stage, layer_index = r.layer_index == nil and json.null or r.layer_index,
      sequence_length = r.sequence_length, start_position = r.start_position,
      -- half-open [first, end) positions of the rows this tensor holds
      token_range = json.array({ r.sequence_length - r.rows, r.sequence_length }),
      shape = json.array({ r.rows, r.cols }), dtype = r.dtype, l2_norm = r.l2_norm, abs_max = r.abs_max,
      fingerprint = json.u64(r.fingerprint),
    })
  end
  return json.encode(json.ordered({ "experiment", "observation_only", "records" }, {
    experiment = "activation-stats", observation_only = true, records = out,
  }), { indent = "  " })
end

return function(args)
  if type(args) == "string" then
    local kv, err = selectors.parse_kv(args)
    if not kv then error("activation-stats: --experiment-args: " .. err, 0) end
    args = kv
  end
  args = args or {}
  local exp = { name = "activation-stats", records = {}, output = args.output, stats = { records = 0 } }
  exp.to_json = function(self) return to_json(self.records) end

  -- stages: a list or "all" | "a,b,..." (selectors.parse_stage_list); none: the residual stream
  local stages = selectors.RESIDUAL_STAGES
  if type(args.stages) == "table" then
    stages = args.stages
  elseif args.stages ~= nil then
    local parsed, err = selectors.parse_stage_list(args.stages)
    if not parsed then error("activation-stats: stages: " .. err, 0) end
    stages = parsed == "all" and selectors.ALL_FAMILY_STAGES or parsed
  end
  for _, name in ipairs(stages) do
    local stage, why = selectors.stage_name(name)
    if not stage then error("activation-stats: stages: " .. why, 0) end
    local per_layer = selectors.LAYER_STAGE_SET[stage]
    exp[stage] = function(self, ctx, view)
      local shape = view:shape()
      self.records[#self.records + 1] = {
        phase = ctx.phase, stage = stage, layer_index = per_layer and ctx.layer_index or nil,
        sequence_length = ctx.sequence_length, start_position = ctx.start_position,
        rows = shape[1], cols = shape[2], dtype = view:dtype(),
        l2_norm = view:l2_norm(), abs_max = view:abs_max(), fingerprint = view:fingerprint(),
      }
      self.stats.records = #self.records
    end
  end

  if exp.output then
    function exp:on_generation_complete()
      fs.write_atomic(self.output, to_json(self.records), "activation-stats")
    end
  end
  return exp
end
