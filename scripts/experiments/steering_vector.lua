-- steering_vector.lua — example intervention: adds a fixed direction, times a scale, to the hidden
-- state leaving one layer (after_layer), at every prompt position and every generated token.
-- Must not allocate per hook call: the vectors are built in on_model_loaded / before_prefill.
--
-- Use: ember --experiment scripts/experiments/steering_vector.lua \
--            --experiment-args "layer=2 scale=4 dim=17"          (unit vector on hidden dim 17)
--      ember ... --experiment-args "layer=2 scale=1 vector=dir.f32" (hidden_size little-endian f32)

local selectors = require("ember.selectors")

return function(args)
  local kv, err = selectors.parse_kv(type(args) == "string" and args or "")
  if type(args) == "table" then kv, err = args, nil end
  if not kv then error("steering-vector: " .. err, 0) end
  local function number(key, parse)
    local v = kv[key]
    if type(v) == "number" then return v end
    local n, perr = parse(v)
    if n == nil then error("steering-vector: " .. key .. ": " .. perr, 0) end
    return n
  end
  local layer = number("layer", selectors.parse_uint)
  local scale = number("scale", selectors.parse_float)
  if (kv.dim == nil) == (kv.vector == nil) then
    error("steering-vector: give exactly one of dim=K (a unit direction) or vector=FILE (raw f32)", 0)
  end
  local dim = kv.dim ~= nil and number("dim", selectors.parse_uint) or nil

  local ember = require("ember")
  local exp = { name = "steering-vector", stats = { additions = 0, layer = layer, scale = scale } }
  local direction -- Lua list of hidden_size values, scaled
  local step, prompt_block -- [1, hidden] and [P, hidden] tensors

  function exp:on_model_loaded(ctx)
    local hidden, n_layers = ctx.model.hidden_size, ctx.model.n_layers
    if layer >= n_layers then
      error(string.format("steering-vector: layer %d is out of range (0-%d)", layer, n_layers - 1), 0)
    end
    direction = {}
    if dim then
      if dim >= hidden then error(string.format("steering-vector: dim %d is out of range (0-%d)", dim, hidden - 1), 0) end
      for i = 1, hidden do direction[i] = (i == dim + 1) and scale or 0.0 end
    else
      local bytes = require("ember.fs").read(kv.vector, "steering-vector: vector file '" .. kv.vector .. "'")
      if #bytes ~= hidden * 4 then
        error(string.format("steering-vector: %s holds %d bytes, expected %d (hidden size %d as f32)",
          kv.vector, #bytes, hidden * 4, hidden), 0)
      end
      for i = 1, hidden do direction[i] = string.unpack("<f", bytes, (i - 1) * 4 + 1) * scale end
    end
    step = ember.tensor(1, hidden, direction)
  end

  -- The prompt is evaluated as one [P, hidden] block, so the direction is repeated P times once.
  function exp:before_prefill(ctx)
    local rows, values = ctx.input_token_count, {}
    for r = 0, rows - 1 do
      for i, v in ipairs(direction) do values[r * #direction + i] = v end
    end
    prompt_block = ember.tensor(rows, #direction, values)
  end

  function exp:after_layer(ctx, hidden)
    if ctx.layer_index ~= layer then return end
    hidden:add(ctx.phase == "prefill" and prompt_block or step)
    self.stats.additions = self.stats.additions + 1
  end
  return exp
end
