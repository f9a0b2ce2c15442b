-- steering_vector.lua — example intervention: adds a fixed direction, times a scale, to the hidden
-- state leaving one layer (after_layer), at every prompt position and every generated token.
-- Must not add anything itself: the addition is ember.experiments.steer's (the factory --steer
-- uses); this file only builds the direction, which needs the model's hidden size.
--
-- Use: ember --experiment scripts/experiments/steering_vector.lua \
--            --experiment-args "layer=2 scale=4 dim=17"           (unit vector on hidden dim 17)
--      ember ... --experiment-args "layer=2 scale=1 vector=dir.f32"  (hidden_size little-endian f32)
--      ember ... --experiment-args "layer=2 scale=1 vector=dir.npy"  (or v.safetensors#name, DIR#record:
--                                                                    any source --steer reads)
-- The same as `ember --steer 2:after_layer:dir.npy:1`.

local xargs = require("ember.run.experiment_args")

return function(args)
  local who = "steering-vector"
  local kv = xargs.kv(args, who)
  local layer = xargs.uint(kv, "layer", who)
  local scale = xargs.number(kv, "scale", who)
  if (kv.dim == nil) == (kv.vector == nil) then
    error("steering-vector: give exactly one of dim=K (a unit direction) or vector=FILE (raw f32, .npy, ...)", 0)
  end
  local dim = kv.dim ~= nil and xargs.uint(kv, "dim", who) or nil

  local ember = require("ember")
  local exp = { name = "steering-vector", stats = { additions = 0, layer = layer, scale = scale } }
  local inner -- the steer experiment, made once the hidden size is known

  -- direction(hidden) -> ember.Tensor [1, hidden]: the unit vector on `dim`, or the file's values
  local function direction(hidden)
    if dim then
      if dim >= hidden then
        error(string.format("steering-vector: dim %d is out of range (0-%d)", dim, hidden - 1), 0)
      end
      local v = {}
      for i = 1, hidden do v[i] = (i == dim + 1) and 1.0 or 0.0 end
      return ember.tensor(1, hidden, v)
    end
    if not kv.vector:match("%.f32$") then return kv.vector end -- a --steer source (ember.store.vector_file)
    -- bounded by what it must hold: a larger file (or /dev/zero) is refused by the reader, naming it
    local bytes = require("ember.store.fs").read(kv.vector, "steering-vector: vector file", hidden * 4)
    if #bytes ~= hidden * 4 then
      error(string.format("steering-vector: %s holds %d bytes, expected %d (hidden size %d as f32)",
        kv.vector, #bytes, hidden * 4, hidden), 0)
    end
    return ember.tensor_from_bytes(bytes, 1, hidden)
  end

  function exp:on_model_loaded(ctx)
    xargs.check_layers(who, layer, ctx.model.n_layers)
    inner = require("ember.experiments.steer").make { name = who, layer = layer, stage = "after_layer",
      vector = direction(ctx.model.hidden_size), scale = scale, notice = function() end }
    inner:on_model_loaded(ctx)
  end

  function exp:after_layer(ctx, hidden)
    inner:after_layer(ctx, hidden)
    self.stats.additions = inner.stats.additions
  end
  return exp
end
