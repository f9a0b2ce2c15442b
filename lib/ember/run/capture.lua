-- ember.run.capture — records live tensors for explicitly selected (stage, layer, phase, position)
-- records during a generation and writes them as an activation artifact (SPEC §6.1).
-- Must not change any value it sees: it reads views (a copy + sha256) and never writes them.
--
-- Selection rules: layer filters apply to the per-layer stages only (before_logits and
-- after_logits are captured whenever their stage is selected); prefill records cover the whole
-- prompt; position filters apply to decode evaluations (position = start_position).

local artifact = require("ember.store.artifact")
local json = require("ember.store.json")
local selectors = require("ember.run.selectors")
local core = require("ember.core")

local M = {}

-- config(opts) -> normalized configuration, or nil and a message.
-- opts: { layers = "all"|{...}, stages = "all"|{...} (nil: the residual-stream stages),
--         phase = "all"|"prefill"|"decode",
--         positions = "all"|{...}, max_records = n|nil, omit_prompt = bool }
-- Strings are parsed with the selector grammars, so CLI flags can be passed through unchanged.
function M.config(opts)
  opts = opts or {}
  local cfg = { omit_prompt = opts.omit_prompt == true }
  local function pick(value, parse, what, ...)
    if value == nil then return "all" end
    if type(value) == "table" then return value end
    local v, err = parse(value, ...)
    if v == nil then return nil, what .. ": " .. err end
    return v
  end
  local err
  cfg.layers, err = pick(opts.layers, selectors.parse_index_list, "capture layers", "layer")
  if not cfg.layers then return nil, err end
  -- no selection: the residual-stream stages; "all": every stage, inside the layer's blocks too
  if opts.stages == nil then
    cfg.stages = { table.unpack(selectors.RESIDUAL_STAGES) }
  else
    cfg.stages, err = pick(opts.stages, selectors.parse_stage_list, "capture stages")
    if not cfg.stages then return nil, err end
  end
  if cfg.stages == "all" then cfg.stages = { table.unpack(selectors.PASS_STAGES) } end
  local named = {}
  for i, s in ipairs(cfg.stages) do -- ember's names, or TransformerLens's (resid_post)
    local stage, why = selectors.stage_name(s)
    if not stage then return nil, "capture stages: " .. why end
    named[i] = stage
  end
  cfg.stages = named
  cfg.phase = opts.phase or "all"
  if not selectors.parse_phase(cfg.phase) then
    return nil, "capture phase: " .. select(2, selectors.parse_phase(cfg.phase))
  end
  cfg.positions, err = pick(opts.positions, selectors.parse_index_list, "capture positions", "position")
  if not cfg.positions then return nil, err end
  if opts.max_records ~= nil then
    local n = opts.max_records
    if type(n) == "string" then n = selectors.parse_uint(n) end
    if math.type(n) ~= "integer" or n < 1 then
      return nil, "capture max records: expected a positive integer, got '" .. tostring(opts.max_records) .. "'"
    end
    cfg.max_records = n
  end
  return cfg
end

-- check(cfg, model_info) -> true, or nil and a message naming the out-of-range layer.
function M.check(cfg, info)
  if cfg.layers ~= "all" then
    for _, l in ipairs(cfg.layers) do
      if l >= info.n_layers then
        return nil, string.format("capture layers: layer %d is out of range (the model has %d layers: 0-%d)",
          l, info.n_layers, info.n_layers - 1)
      end
    end
  end
  return true
end

-- The exact configuration as JSON; its sha256 is recorded, so two artifacts say whether they were
-- captured with the same selection.
function M.config_json(cfg)
  local function list(v) return v == "all" and "all" or json.array({ table.unpack(v) }) end
  return json.ordered({ "stages", "layers", "phase", "positions", "max_records", "omit_prompt" }, {
    stages = json.array({ table.unpack(cfg.stages) }), layers = list(cfg.layers), phase = cfg.phase,
    positions = list(cfg.positions), max_records = cfg.max_records or json.null, omit_prompt = cfg.omit_prompt,
  })
end

function M.config_sha256(cfg)
  return core.sha256(json.encode(M.config_json(cfg)))
end

local function set_of(list)
  if list == "all" then return nil end
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

-- experiment(cfg) -> the capture experiment (name "capture"). Captured records accumulate in
-- exp.records; exp.stats counts them and the records the cap dropped; exp.model is the model it
-- ran on ({ family, n_layers, hidden_size, n_vocab }), so the capture can be a patch's source
-- as it stands (ember.run.patch), without an artifact on disk.
function M.experiment(cfg)
  local layers, positions = set_of(cfg.layers), set_of(cfg.positions)
  local phase, cap = cfg.phase, cfg.max_records or math.huge
  local exp = { name = "capture", config = cfg, records = {}, stats = { records = 0, dropped = 0 } }
  function exp:on_model_loaded(ctx)
    self.model = { family = ctx.family, n_layers = ctx.n_layers, hidden_size = ctx.hidden_size, n_vocab = ctx.n_vocab }
  end
  for _, stage in ipairs(cfg.stages) do
    local per_layer = selectors.LAYER_STAGE_SET[stage]
    exp[stage] = function(self, ctx, view)
      if phase ~= "all" and ctx.phase ~= phase then return end
      local layer = per_layer and ctx.layer_index or nil
      if layers and per_layer and not layers[layer] then return end
      if positions and ctx.phase == "decode" and not positions[ctx.start_position] then return end
      if #self.records >= cap then
        self.stats.dropped = self.stats.dropped + 1
        return
      end
      local shape = view:shape()
      self.records[#self.records + 1] = {
        stage = stage, layer = layer, phase = ctx.phase, start_position = ctx.start_position,
        shape = { shape[1], shape[2] }, tensor = view:clone(), sha256 = view:sha256(),
      }
      self.stats.records = #self.records
    end
  end
  return exp
end

-- write(dir, exp, sections) -> manifest: the artifact of a finished capture run. `sections` are
-- the run's provenance (manifest.sections); the prompt text is dropped when omit_prompt is set.
function M.write(dir, exp, sections)
  local s = {}
  for k, v in pairs(sections) do s[k] = v end
  local cfg = exp.config
  if cfg.omit_prompt and type(s.prompt) == "table" then
    local p = {}
    for k, v in pairs(s.prompt) do p[k] = v end
    p.text, p.withheld = json.null, true
    s.prompt = json.ordered({ "sha256", "source", "text", "withheld", "token_count" }, p)
  end
  s.capture = json.ordered({ "config", "config_sha256", "output_dir", "record_count", "dropped_records" }, {
    config = M.config_json(cfg), config_sha256 = M.config_sha256(cfg), output_dir = dir,
    record_count = #exp.records, dropped_records = exp.stats.dropped,
  })
  return artifact.write(dir, s, exp.records)
end

return M
