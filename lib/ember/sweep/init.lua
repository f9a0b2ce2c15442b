-- ember.sweep — causal sweeps: for every cell (stage, layer, position) of a grid, patch the clean
-- prompt's activation into the corrupted prompt's run and measure the next-token logits (after
-- the prefill, or after decode_steps greedy tokens when positions beyond the prompt are swept).
-- Must not parse flags or draw: the CLI (cli/sweep.lua) and plots (sweep/plot.lua, analysis/plot.lua) sit on top of it.
--
-- Certified cells: when the row a cell writes already holds the clean bytes, the patched run must
-- be bit-identical to the corrupted baseline; the engine checks that for every such cell and fails
-- the sweep otherwise (it would mean patching is not the pure replacement it claims to be).

local capture = require("ember.run.capture")
local json = require("ember.store.json")
local patch = require("ember.run.patch")
local selectors = require("ember.run.selectors")
local metric_mod = require("ember.sweep.metric")
local store = require("ember.sweep.store")
local reuse = require("ember.sweep.reuse")
local pairs_mod = require("ember.sweep.pairs")
local pairs_cell = require("ember.sweep.pairs_cell")
local batched = require("ember.sweep.batch_cells")
local token_label = require("ember.analysis.token_label")
local is_interrupt = require("ember.model.generate").is_interrupt
local core = require("ember.core")

local M = {}

local function fail(msg, ...) error("sweep: " .. string.format(msg, ...), 0) end

-- The grid's cells in their fixed order (stage-major, then layer, then position); index is 0-based.
function M.cells(grid)
  local out = {}
  for _, stage in ipairs(grid.stages) do
    for _, layer in ipairs(grid.layers) do
      for _, pos in ipairs(grid.positions) do
        out[#out + 1] = { index = #out, stage = stage, layer = layer, position = pos }
      end
    end
  end
  return out
end

-- in_shard(index, shard) -> does this cell belong to shard I of N? Round-robin, so every shard of
-- a grid ordered by layer gets a share of cheap and expensive cells alike.
function M.in_shard(index, shard)
  return shard == nil or index % shard.count == shard.index
end

-- parse_shard("I/N") -> { index, count } or nil and a message
function M.parse_shard(s)
  if type(s) == "table" then return s end
  local i, n = tostring(s):match("^(%d+)/(%d+)$")
  i, n = tonumber(i), tonumber(n)
  if not i or not n or n < 1 or i >= n then
    return nil, "expected I/N with 0 <= I < N (e.g. 0/4), got '" .. tostring(s) .. "'"
  end
  return { index = math.tointeger(i), count = math.tointeger(n) }
end

local function list_of(v, all, what)
  if v == nil or v == "all" then return { table.unpack(all) } end
  if type(v) == "string" then
    local parsed, err = selectors.parse_index_list(v, what)
    if not parsed then fail("%ss: %s", what, err) end
    if parsed == "all" then return { table.unpack(all) } end
    v = parsed
  end
  return v
end

local function prompt_ids(model, p, what)
  if type(p) == "table" then
    if p.ids then return p.ids, p.text end
    return p, nil
  end
  if type(p) ~= "string" then fail("%s prompt is required (text or a list of token ids)", what) end
  return model:tokenize(p), p
end

-- config(model, opts) -> the normalized sweep definition (everything that decides the grid's values).
local function config(model, opts)
  local info = model.info
  local clean_ids, clean_text = prompt_ids(model, opts.clean, "clean")
  local corr_ids, corr_text = prompt_ids(model, opts.corrupted, "corrupted")
  if #clean_ids ~= #corr_ids then
    -- both prompts' pieces, so the token that splits differently is in sight
    fail("the clean prompt has %d tokens and the corrupted prompt %d: patching by position needs equal lengths\n"
      .. "  clean:     %s\n  corrupted: %s", #clean_ids, #corr_ids,
      table.concat(token_label.positions(model, clean_ids), " | "),
      table.concat(token_label.positions(model, corr_ids), " | "))
  end
  local m, err = metric_mod.parse(opts.metric or "kl")
  if not m then fail("%s", err) end
  -- token strings (" Paris") through the tokenizer: refused unless each is one token
  m = metric_mod.token_ids(m, function(text) return model:to_single_token(text) end)
  local stages = opts.stages
  if stages == nil then stages = { "after_layer" } end
  if type(stages) == "string" then
    local parsed, serr = selectors.parse_stage_list(stages)
    if not parsed then fail("stages: %s", serr) end
    stages = parsed == "all" and { table.unpack(selectors.RESIDUAL_LAYER_STAGES) } or parsed
  end
  local named = {}
  for i, s in ipairs(stages) do
    local stage, serr = selectors.stage_name(s)
    if not stage then fail("stages: %s", serr) end
    local ok, why = selectors.check_residual_layer_stage(stage)
    if not ok then fail("%s", why) end
    named[i] = stage
  end
  stages = named
  local steps = opts.decode_steps or 0
  if math.type(steps) ~= "integer" or steps < 0 then
    fail("decode_steps must be a non-negative integer, got %s", tostring(opts.decode_steps))
  end
  -- decode step k (1-based) evaluates position #prompt + k - 1: those are the positions beyond the prompt
  local n_pos = #clean_ids + steps
  local all_layers, all_pos = {}, {}
  for l = 0, info.n_layers - 1 do all_layers[#all_layers + 1] = l end
  for p = 0, n_pos - 1 do all_pos[#all_pos + 1] = p end
  local layers = list_of(opts.layers, all_layers, "layer")
  local positions = list_of(opts.positions, all_pos, "position")
  for _, l in ipairs(layers) do
    if math.type(l) ~= "integer" or l < 0 or l >= info.n_layers then
      fail("layer %s is out of range (the model has %d layers: 0-%d)", tostring(l), info.n_layers, info.n_layers - 1)
    end
  end
  for _, p in ipairs(positions) do
    if math.type(p) ~= "integer" or p < 0 or p >= n_pos then
      if steps == 0 then
        fail("position %s is out of range (the prompts have %d tokens: 0-%d)", tostring(p), #clean_ids, #clean_ids - 1)
      end
      fail("position %s is out of range (%d prompt tokens + %d decode steps: 0-%d)", tostring(p), #clean_ids, steps,
        n_pos - 1)
    end
  end
  return { clean_ids = clean_ids, clean_text = clean_text, corrupted_ids = corr_ids, corrupted_text = corr_text,
    metric = m, decode_steps = steps, grid = { stages = stages, layers = layers, positions = positions } }
end

-- One run: the prefill, then `steps` greedy decodes (each feeding back the top-1 token, lowest id on
-- ties, end-of-sequence ignored so every run evaluates the same positions), all with the
-- experiment. Returns the last logits tensor and the generated ids.
local function run_once(session, ids, steps, exp)
  local opts = exp and { experiment = exp } or nil
  session:reset()
  local logits = session:prefill(ids, opts)
  local generated = {}
  for _ = 1, steps do
    local t = logits:argmax() - 1
    generated[#generated + 1] = t
    logits = session:decode(t, opts)
  end
  return logits, generated
end

-- baselines(model, session, cfg) -> clean capture records, clean and corrupted logits and generated ids
local function baselines(model, session, cfg)
  local steps = cfg.decode_steps
  local ccfg = assert(capture.config { stages = cfg.grid.stages, layers = cfg.grid.layers,
    phase = steps > 0 and "all" or "prefill" })
  local cap = capture.experiment(ccfg)
  local clean, clean_gen = run_once(session, cfg.clean_ids, steps, cap)
  for i, r in ipairs(cap.records) do r.index = i - 1 end
  local corrupted, corr_gen = run_once(session, cfg.corrupted_ids, steps)
  return cap.records, clean, corrupted, clean_gen, corr_gen
end

-- source_finder(records) -> function(cell) -> the clean record holding the cell's position (the
-- records by (stage, layer): the clean prefill of each selected layer, and its decodes)
local function source_finder(records)
  local source = {}
  for _, r in ipairs(records) do
    local k = r.stage .. "|" .. r.layer
    source[k] = source[k] or {}
    table.insert(source[k], r)
  end
  return function(c)
    for _, r in ipairs(source[c.stage .. "|" .. c.layer]) do
      if c.position >= r.start_position and c.position < r.start_position + r.shape[1] then return r end
    end
    fail("no clean record holds %s layer %d position %d", c.stage, c.layer, c.position)
  end
end

-- The fields of cell c every pair u's value shares (its source row, the baselines' values); with
-- `free`, those of a cell certified without a pass: its tokens are the same in both runs up to its
-- position (reuse.lua), so its value is the corrupted run's.
local function cell_head(b, u, c, free)
  local src = u.source_of(c)
  local cell = { index = c.index, stage = c.stage, layer = c.layer, position = c.position,
    clean_value = u.clean_value, corrupted_value = u.corr_value, source_sha256 = src.sha256,
    source_row = c.position - src.start_position, settings_sha256 = b.doc.settings_sha256 }
  if free then
    u.free = u.free + 1
    cell.value, cell.certified, cell.equals_corrupted = u.corr_value, true, true
    cell.logits_sha256, cell.top1 = u.corr_sha256, u.corr_top1
    cell.generated_ids = b.cfg.decode_steps > 0 and u.corr_gen or nil
  end
  return cell
end

-- The patch of pair u's clean activation at cell c.
local function cell_patch(b, u, c)
  return patch.experiment { source = u.src_art, target = { layer = c.layer, stage = c.stage }, model = b.model,
    positions = { c.position }, certify = true }
end

-- cell (from cell_head) completed from the patched run's logits and generated ids: the metric read,
-- certified when every patched row held the clean bytes already (then the logits must be the
-- corrupted run's, bit for bit).
local function cell_tail(b, u, c, cell, p, logits, generated)
  p:on_generation_complete()
  local certified = p.identical()
  local bytes = logits:bytes()
  if certified and bytes ~= u.corr_bytes then
    fail("certified cell %s layer %d position %d%s: the patched row was bit-identical to the one it replaced, "
      .. "yet the logits differ from the corrupted baseline", c.stage, c.layer, c.position, u.where)
  end
  cell.value, cell.certified, cell.equals_corrupted = u.measure(logits), certified, bytes == u.corr_bytes
  cell.logits_sha256, cell.top1 = core.sha256(bytes), logits:argmax() - 1
  cell.generated_ids = b.cfg.decode_steps > 0 and generated or nil
  return cell
end

-- unit_cell(b, u, c) -> the fields of cell c for one pair u (its baselines, session and reuse):
-- the clean activation patched into the corrupted run at the cell, the metric read.
local function unit_cell(b, u, c)
  local free = u.reuse and u.reuse:same_prefix(c.position)
  local cell = cell_head(b, u, c, free)
  if free then return cell end
  local p = cell_patch(b, u, c)
  local logits, generated
  if u.reuse then
    logits, generated = u.reuse:run(c.position, p)
  else
    logits, generated = run_once(u.session, u.corrupted_ids, b.cfg.decode_steps, p)
  end
  return cell_tail(b, u, c, cell, p, logits, generated)
end

-- batch_cells(b, c) -> the fields of cell c for every pair, the pairs that need a pass evaluated
-- together in b.batch (batch_cells.lua)
local function batch_cells(b, c)
  local each, list, exps = {}, {}, {}
  for i, u in ipairs(b.units) do
    local free = u.reuse:same_prefix(c.position)
    each[i] = cell_head(b, u, c, free)
    if not free then
      list[#list + 1] = i
      exps[i] = cell_patch(b, u, c)
    end
  end
  if #list == 0 then return each end
  local logits = b.batch:run(list, c.position, exps, c.stage)
  for k, i in ipairs(list) do each[i] = cell_tail(b, b.units[i], c, each[i], exps[i], logits[k], {}) end
  return each
end

-- compute(b, c) -> the manifest entry of cell c: one pair's cell, or over many pairs the mean of
-- their values with its standard error and each pair's value (pairs_cell.lua)
local function compute(b, c)
  if not b.pairs then return store.cell(unit_cell(b, b.units[1], c)) end
  local each = {}
  if b.batch then
    each = batch_cells(b, c)
  else
    for i, u in ipairs(b.units) do each[i] = unit_cell(b, u, c) end
  end
  return store.cell(pairs_cell.aggregate(each, b.clean_mean, b.corr_mean))
end

-- new_unit(model, cfg, clean_ids, corrupted_ids, metric, reuse_on, where) -> one pair's state:
-- its session (holding the corrupted baseline's cache when reuse is on), the clean capture, both
-- baselines' logits and generated ids, its metric resolved and measured on both
local function new_unit(model, cfg, clean_ids, corrupted_ids, metric, reuse_on, where)
  local session = model:session { context = #clean_ids + cfg.decode_steps }
  local records, clean_logits, corr_logits, clean_gen, corr_gen = baselines(model, session, { clean_ids = clean_ids,
    corrupted_ids = corrupted_ids, grid = cfg.grid, decode_steps = cfg.decode_steps })
  metric = metric_mod.resolve(metric, clean_logits, corr_logits, model.info.n_vocab)
  local measure = metric_mod.evaluator(metric, clean_logits)
  local u = { session = session, metric = metric, measure = measure, where = where or "",
    clean_ids = clean_ids, corrupted_ids = corrupted_ids, clean_logits = clean_logits, corr_logits = corr_logits,
    clean_gen = clean_gen, corr_gen = corr_gen, clean_value = measure(clean_logits), corr_value = measure(corr_logits),
    corr_bytes = corr_logits:bytes(), corr_top1 = corr_logits:argmax() - 1, free = 0,
    source_of = source_finder(records),
    src_art = { dir = "clean run (in memory)", manifest = { model = { family = model.info.family } },
      records = records } }
  u.corr_sha256 = core.sha256(u.corr_bytes)
  -- the session holds the corrupted baseline's whole cache now (baselines ran it last)
  if reuse_on then
    u.reuse = reuse.new { session = session, clean_ids = clean_ids, corrupted_ids = corrupted_ids,
      clean_generated = clean_gen, corrupted_generated = corr_gen, steps = cfg.decode_steps }
  end
  return u
end

-- setup(model, opts) -> b: the config, the shard, one unit per pair (a single clean/corrupted
-- pair is one), and the sweep's manifest document
local function setup(model, opts)
  local dataset
  if opts.pairs ~= nil then
    if opts.clean ~= nil or opts.corrupted ~= nil then fail("give either pairs or clean and corrupted, not both") end
    dataset = pairs_mod.read(model, opts.pairs, opts.decode_steps or 0)
    local first = dataset.items[1]
    opts = setmetatable({ clean = { ids = first.clean_ids, text = first.clean_text },
      corrupted = { ids = first.corrupted_ids, text = first.corrupted_text } }, { __index = opts })
  end
  local cfg = config(model, opts)
  local shard
  if opts.shard ~= nil then
    local err
    shard, err = M.parse_shard(opts.shard)
    if not shard then fail("shard: %s", err) end
  end
  local b = { model = model, cfg = cfg, shard = shard, units = {}, pairs = dataset ~= nil }
  local reuse_on = opts.reuse ~= false
  if dataset then
    for i, it in ipairs(dataset.items) do
      b.units[i] = new_unit(model, cfg, it.clean_ids, it.corrupted_ids, pairs_mod.metric_for(cfg.metric, it),
        reuse_on, " of " .. it.where)
    end
    -- the pairs' cells in one batch (prompt positions over the corrupted caches; with decode steps,
    -- or without reuse, pair after pair): each pair's cache lives in the batch, not its session
    if reuse_on and cfg.decode_steps == 0 and #b.units > 1 and opts.batch ~= false then
      b.batch = batched.new(model, b.units)
      for _, u in ipairs(b.units) do
        u.session:close()
        u.session = nil
      end
    end
  else
    b.units[1] = new_unit(model, cfg, cfg.clean_ids, cfg.corrupted_ids, cfg.metric, reuse_on)
  end
  local u1 = b.units[1]
  local explicit = cfg.metric
  cfg.metric = u1.metric
  b.doc = store.new_manifest {
    model = model, cfg = cfg, shard = shard, tokenizer_path = opts.tokenizer_path, argv = opts.argv,
    clean_logits = u1.clean_logits, corrupted_logits = u1.corr_logits, clean_value = u1.clean_value,
    clean_generated = u1.clean_gen, corrupted_generated = u1.corr_gen,
    corrupted_value = u1.corr_value, text = function(id) return token_label.token(model, id) end,
  }
  if dataset then
    b.clean_mean, b.corr_mean = pairs_cell.section(b.doc, dataset, b.units, explicit,
      function(id) return token_label.token(model, id) end)
  end
  return b
end

-- run(opts) -> result { manifest, cells, stats = { total, computed, resumed, grid_cells,
--   certified_without_pass }, dir }
-- opts: { model = ember.Model, clean = text|{ids}, corrupted = text|{ids}, metric = "kl" |
--   "logit-diff[:A,B]" | "prob[:A]" | "logit[:A]" | "logprob[:A]", stages = {...}|"all" (default {"after_layer"}),
--   layers = "all"|{...}, positions = "all"|{...} (0-based; with decode_steps = N > 0 the positions
--   run on to #prompt + N - 1 and the metric is read after N greedy decodes), shard = "I/N"|{index,count},
--   out = DIR (resumed when it holds part of the same sweep), max_cells = n (stop after n new cells: a budget),
--   progress = reporter (sweep_progress), checkpoint_seconds = s (default 1; 0 = every cell),
--   tokenizer_path, argv, on_cell = function(cell),
--   reuse = false (evaluate every cell from position 0 instead of from its position on; the same bits),
--   batch = false (with pairs: evaluate them one after another instead of in one batch; the same bits) }
function M.run(opts)
  local model = opts.model
  if model == nil then fail("model is required") end
  local b = setup(model, opts)
  local doc = b.doc
  local done, resumed = {}, 0
  if opts.out then
    local prev = store.read_for_resume(opts.out, doc)
    if prev then
      for _, c in ipairs(prev.cells) do done[c.index] = c; resumed = resumed + 1 end
    end
  end

  local all = M.cells(b.cfg.grid)
  local mine = {}
  for _, c in ipairs(all) do if M.in_shard(c.index, b.shard) then mine[#mine + 1] = c end end
  local progress = opts.progress
  if progress then progress:start(#mine, resumed) end

  local computed, last_write = 0, store.now()
  local checkpoint = opts.checkpoint_seconds or 1
  local function cells_list()
    local list = {}
    for _, c in ipairs(mine) do if done[c.index] then list[#list + 1] = done[c.index] end end
    return list
  end
  local function save()
    if not opts.out then return end
    local list = cells_list()
    doc.status = #list == #mine and "complete" or "partial"
    store.write(opts.out, doc, list, all)
    last_write = store.now()
  end

  local ok, err = pcall(function()
    for _, c in ipairs(mine) do
      if not done[c.index] then
        if opts.max_cells and computed >= opts.max_cells then break end
        local cell = compute(b, c)
        done[c.index] = cell
        computed = computed + 1
        if opts.on_cell then opts.on_cell(cell) end
        if progress then progress:step() end
        if checkpoint <= 0 or store.now() - last_write >= checkpoint then save() end
      end
    end
  end)
  -- whatever happened, the cells computed so far are kept: a rerun resumes from them
  local sok, serr = pcall(save)
  if progress then progress:finish(ok) end
  if not ok and sok and is_interrupt(err) then
    -- Ctrl-C lands in whatever Lua runs next, often a patch hook of a layer outside the grid: the
    -- message says what matters instead (what is kept, how to go on)
    if opts.out then
      error(string.format("interrupted: %d cells saved, rerun the same command to resume", #cells_list()), 0)
    end
    error(string.format("interrupted after %d cells (nothing saved: no out)", computed), 0)
  end
  if not ok then error(err, 0) end
  if not sok then error(serr, 0) end
  local list = cells_list()
  doc.status = #list == #mine and "complete" or "partial"
  local free = 0
  for _, u in ipairs(b.units) do free = free + u.free end
  if b.batch then b.batch:close() end
  return { manifest = doc, cells = list, dir = opts.out,
    stats = { total = #mine, computed = computed, resumed = resumed, grid_cells = #all,
      certified_without_pass = free } }
end

return M
