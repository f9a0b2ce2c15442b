-- ember.sweep.store — the sweep artifact on disk: DIR/manifest.json (provenance, baselines, one
-- entry per computed cell) and DIR/grid.safetensors (the metric grid), plus resume, merge and the
-- cell-by-cell comparison of two sweeps. Must not run the model (sweep/init.lua does).
--
-- The manifest is the truth: the grid file is rebuilt from its cells at every write, so a run
-- interrupted between the two writes resumes from the manifest and rewrites a consistent grid.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local manifest = require("ember.store.manifest")
local safetensors = require("ember.store.safetensors")
local selectors = require("ember.run.selectors")
local shapes = require("ember.store.shape")
local sweep_metric = require("ember.sweep.metric")
local pairs_cell = require("ember.sweep.pairs_cell")
local token_label = require("ember.analysis.token_label")
local core = require("ember.core")

local M = {}

M.SCHEMA = "ember.sweep"
M.SCHEMA_VERSION = "1.0.0"
M.MANIFEST = "manifest.json"
M.GRID = "grid.safetensors"
-- The largest manifest.json and grid.safetensors read (fs.read's bound for a sweep's files).
M.MAX_MANIFEST_BYTES = 1 << 30
M.MAX_GRID_BYTES = 1 << 30
-- The most cells a grid may hold (stages x layers x positions): each cell is a run of the model.
M.MAX_CELLS = 1 << 24

local sha256 = core.sha256
local function fail(msg, ...) error(string.format(msg, ...), 0) end

-- Wall-clock seconds with centisecond resolution where Linux offers it (progress and checkpoints).
function M.now()
  return tonumber(((fs.read_system("/proc/uptime", 64) or ""):match("^(%S+)"))) or os.time()
end

local ORDER = { "schema", "schema_version", "status", "created_at_unix", "tool", "model", "tokenizer", "clean",
  "corrupted", "pairs", "metric", "grid", "settings_sha256", "shard", "merged_from", "execution", "plot", "argv",
  "grid_file", "cells" }
-- generated_ids (runs and cells) exists only in sweeps with decode steps, so a prefill-only sweep
-- writes exactly the bytes it always did
local RUN_KEYS = { "prompt", "input_ids", "tokens", "generated_ids", "logits_sha256", "top1", "value" }
-- stderr and values (each pair's) only in sweeps over pairs (pairs_cell.lua), where value is their mean
local CELL_KEYS = { "index", "stage", "layer", "position", "target", "value", "stderr", "values", "recovered",
  "certified",
  "equals_corrupted", "top1", "generated_ids", "logits_sha256", "source", "settings_sha256" }

local function ints(t) return json.array({ table.unpack(t) }) end
local function num(v) return (type(v) == "string" and tonumber(v:gsub("Infinity", "inf"))) or v end

-- Floats come back from JSON as integers when whole; values are doubles, so they are made doubles
-- again (a resumed manifest must encode to the same bytes as a fresh one).
local function float(v)
  if v == nil or v == json.null then return json.null end
  if v == "NaN" then return 0 / 0 end
  if v == "Infinity" then return math.huge end
  if v == "-Infinity" then return -math.huge end
  return num(v) + 0.0
end

-- cell(c) -> the manifest entry of one computed cell, keys in their fixed order.
function M.cell(c)
  local recovered = c.recovered
  if recovered == nil then
    -- the share of the clean-vs-corrupted gap this patch closes: 0 = corrupted, 1 = clean
    local denom = c.clean_value - c.corrupted_value
    recovered = (denom ~= 0 and denom == denom) and (c.value - c.corrupted_value) / denom or json.null
  end
  local src = c.source or { run = "clean", record_sha256 = c.source_sha256, row = c.source_row }
  local values
  if c.values then
    values = json.array()
    for i, v in ipairs(c.values) do values[i] = float(v) end
  end
  return json.ordered(CELL_KEYS, {
    index = c.index, stage = c.stage, layer = c.layer, position = c.position,
    target = c.target or string.format("%d:%s@%d", c.layer, c.stage, c.position),
    value = float(c.value), stderr = c.stderr ~= nil and float(c.stderr) or nil, values = values,
    recovered = recovered == json.null and json.null or float(recovered),
    certified = c.certified == true, equals_corrupted = c.equals_corrupted == true,
    top1 = c.top1, generated_ids = c.generated_ids and ints(c.generated_ids) or nil, logits_sha256 = c.logits_sha256,
    source = json.ordered({ "run", "record_sha256", "row" }, { run = src.run, record_sha256 = src.record_sha256,
      row = src.row }),
    settings_sha256 = c.settings_sha256,
  })
end

-- new_manifest(p) -> the manifest document of a sweep (without cells). p: { model, cfg (sweep
-- config), shard, tokenizer_path, argv, clean_logits, corrupted_logits, clean_value,
-- corrupted_value, clean_generated, corrupted_generated (ids of the decode steps),
-- text = function(id) -> label }
function M.new_manifest(p)
  local cfg, model = p.cfg, p.model
  local msec = manifest.model_section(model)
  local steps = cfg.decode_steps or 0
  local function run_section(text, ids, generated, logits, value)
    local labels = json.array()
    for i, id in ipairs(ids) do labels[i] = p.text(id) end
    return json.ordered(RUN_KEYS, {
      prompt = manifest.prompt_section(text, ids, false), input_ids = ints(ids), tokens = labels,
      generated_ids = steps > 0 and ints(generated) or nil,
      logits_sha256 = logits:sha256(), top1 = logits:argmax() - 1, value = value,
    })
  end
  local clean = run_section(cfg.clean_text, cfg.clean_ids, p.clean_generated, p.clean_logits, p.clean_value)
  local corrupted = run_section(cfg.corrupted_text, cfg.corrupted_ids, p.corrupted_generated, p.corrupted_logits,
    p.corrupted_value)
  -- the token each run feeds at every position: the prompt's, then (decode steps) the generated ones
  local function label_at(run, pos)
    if pos < #run.tokens then return run.tokens[pos + 1] end
    return p.text(run.generated_ids[pos - #run.tokens + 1])
  end
  local metric = json.ordered({ "kind", "tokens", "label" }, { kind = cfg.metric.kind, tokens = ints(cfg.metric.tokens),
    label = sweep_metric.label(cfg.metric, p.text) })
  local g = cfg.grid
  local position_labels = json.array()
  for i, pos in ipairs(g.positions) do
    local a, b = label_at(clean, pos), label_at(corrupted, pos)
    position_labels[i] = string.format("%d %s", pos, a == b and a or (a .. "/" .. b))
  end
  local grid = json.ordered({ "stages", "layers", "positions", "shape", "order", "position_labels", "phase",
    "decode_steps" }, {
    stages = json.array({ table.unpack(g.stages) }), layers = ints(g.layers), positions = ints(g.positions),
    shape = ints({ #g.stages, #g.layers, #g.positions }), order = "stage,layer,position",
    position_labels = position_labels, phase = steps > 0 and "prefill+decode" or "prefill",
    decode_steps = steps > 0 and steps or nil,
  })
  -- what decides every cell's value, hashed once so each cell can name it
  local settings = json.encode(json.ordered({ "metric", "grid", "clean_ids", "corrupted_ids" }, {
    metric = json.ordered({ "kind", "tokens" }, { kind = metric.kind, tokens = metric.tokens }),
    grid = json.ordered({ "stages", "layers", "positions", "decode_steps" }, { stages = grid.stages,
      layers = grid.layers, positions = grid.positions, decode_steps = grid.decode_steps }),
    clean_ids = clean.input_ids, corrupted_ids = corrupted.input_ids }))
  local argv = json.array()
  for i, a in ipairs(p.argv or {}) do argv[i] = tostring(a) end
  return {
    schema = M.SCHEMA, schema_version = M.SCHEMA_VERSION, status = "partial", created_at_unix = os.time(),
    tool = json.ordered({ "name", "version" }, { name = "ember", version = core.version }),
    model = msec, tokenizer = manifest.tokenizer_section(p.tokenizer_path, msec.sha256),
    clean = clean, corrupted = corrupted, metric = metric, grid = grid, settings_sha256 = sha256(settings),
    shard = p.shard and json.ordered({ "index", "count" }, { index = p.shard.index, count = p.shard.count })
      or json.null,
    execution = manifest.execution_section(model), argv = argv,
  }
end

-- Fields that decide the values of the cells: two sweeps (or shards) that differ in any of them
-- cannot be joined or resumed into each other. Kernel sets are here because bit-identity is only
-- promised for one kernel set (and one KV cache type); thread counts are not (the grid does not
-- depend on them).
M.SEMANTIC = { "tool.version", "model.sha256", "tokenizer.sha256", "clean.prompt.sha256", "clean.input_ids",
  "clean.logits_sha256", "corrupted.prompt.sha256", "corrupted.input_ids", "corrupted.logits_sha256",
  "pairs.count", "pairs.sha256",
  "metric.kind", "metric.tokens", "grid.stages", "grid.layers", "grid.positions", "grid.decode_steps",
  "settings_sha256",
  "execution.kernels", "execution.kv_cache" }

local function field(doc, path)
  local v = doc
  for k in path:gmatch("[^.]+") do
    if type(v) ~= "table" then return nil end
    v = v[k]
  end
  return v
end

local function text_of(v)
  if v == nil then return "(absent)" end
  local s = json.encode(v)
  if #s > 80 then s = s:sub(1, 77) .. "..." end
  return s
end

-- differences(a, b [, extra]) -> list of { path, a, b } over the semantic fields (and `extra`)
function M.differences(a, b, extra)
  local out = {}
  local paths = { table.unpack(M.SEMANTIC) }
  for _, p in ipairs(extra or {}) do paths[#paths + 1] = p end
  for _, p in ipairs(paths) do
    local x, y = field(a, p), field(b, p)
    local tx, ty = text_of(x), text_of(y)
    if tx ~= ty then out[#out + 1] = { path = p, a = tx, b = ty } end
  end
  return out
end

-- ---- writing ---------------------------------------------------------------------------------------

local function pack_f32(v)
  if v == nil or v == json.null then return string.pack("<f", 0 / 0) end
  return string.pack("<f", v)
end

-- grid_blob(doc, cells) -> safetensors bytes: metric, recovered, certified, each [stages, layers,
-- positions] f32 (NaN where a cell is not in this artifact; certified is 1 or 0).
function M.grid_blob(doc, cells)
  local shape = doc.grid.shape
  local n = shapes.check(shape, M.MAX_CELLS, "sweep grid")
  local by = {}
  for _, c in ipairs(cells) do by[c.index] = c end
  local parts = { metric = {}, recovered = {}, certified = {} }
  for i = 0, n - 1 do
    local c = by[i]
    parts.metric[i + 1] = pack_f32(c and c.value)
    parts.recovered[i + 1] = pack_f32(c and c.recovered)
    parts.certified[i + 1] = pack_f32(c and (c.certified and 1.0 or 0.0))
  end
  local tensors = {}
  for _, name in ipairs({ "metric", "recovered", "certified" }) do
    tensors[#tensors + 1] = { name = name, shape = { shape[1], shape[2], shape[3] }, data = table.concat(parts[name]) }
  end
  return safetensors.encode(tensors, { format = "pt", schema = M.SCHEMA, schema_version = M.SCHEMA_VERSION,
    order = "stage,layer,position" })
end

-- write(dir, doc, cells): the grid file first, then the manifest that vouches for it, each
-- atomically (temporary file + rename). `dir` is created when missing.
function M.write(dir, doc, cells)
  local where = "sweep '" .. dir .. "'"
  local ok, err = fs.mkdir_p(dir)
  if not ok then fail("%s: %s", where, err) end
  local blob = M.grid_blob(doc, cells)
  doc.grid_file = json.ordered({ "name", "size", "sha256" }, { name = M.GRID, size = #blob, sha256 = sha256(blob) })
  local list = json.array()
  for i, c in ipairs(cells) do list[i] = c end
  doc.cells = list
  fs.write_atomic(fs.join(dir, M.GRID), blob, where)
  fs.write_atomic(fs.join(dir, M.MANIFEST), json.encode(json.ordered(ORDER, doc), { indent = "  " }), where)
end

-- ---- reading ---------------------------------------------------------------------------------------

local KEYS = {
  tool = { "name", "version" },
  model = { "path", "sha256", "family", "architecture", "name", "n_layers", "hidden_size", "n_vocab",
    "dtype_summary", "experimental" },
  tokenizer = { "source", "path", "sha256" },
  metric = { "kind", "tokens", "label" },
  grid = { "stages", "layers", "positions", "shape", "order", "position_labels", "phase", "decode_steps" },
  shard = { "index", "count" },
  execution = { "kernels", "threads" },
  plot = { "tool", "title", "xlabel", "ylabel", "cblabel", "xtics", "ytics", "files" },
  grid_file = { "name", "size", "sha256" },
}
-- one entry of plot.files: a figure of one stage (value: "metric" or "recovered")
M.PLOT_FILE_KEYS = { "stage", "value", "title", "cblabel", "palette", "svg", "png" }
local PROMPT_KEYS = { "sha256", "source", "text", "withheld", "token_count" }

-- A decoded manifest written back must give the same text as the one first written: key orders
-- come back (JSON objects are unordered to cjson) and lists stay lists even when empty.
local function restore_shape(doc)
  for k, keys in pairs(KEYS) do if type(doc[k]) == "table" then json.ordered(keys, doc[k]) end end
  for _, k in ipairs({ "clean", "corrupted" }) do
    local r = doc[k]
    json.ordered(RUN_KEYS, r)
    if type(r.prompt) == "table" then json.ordered(PROMPT_KEYS, r.prompt) end
    for _, a in ipairs({ "input_ids", "tokens", "generated_ids" }) do
      if type(r[a]) == "table" then json.array(r[a]) end
    end
  end
  json.array(doc.metric.tokens or {})
  pairs_cell.restore(doc.pairs)
  for _, a in ipairs({ "stages", "layers", "positions", "shape", "position_labels" }) do
    if type(doc.grid[a]) == "table" then json.array(doc.grid[a]) end
  end
  if type(doc.argv) == "table" then json.array(doc.argv) end
  if type(doc.plot) == "table" then
    for _, a in ipairs({ "xtics", "ytics", "files" }) do
      if type(doc.plot[a]) == "table" then json.array(doc.plot[a]) end
    end
    for _, f in ipairs(doc.plot.files or {}) do
      json.ordered(M.PLOT_FILE_KEYS, f)
    end
  end
  if type(doc.merged_from) == "table" then
    json.array(doc.merged_from)
    for _, m in ipairs(doc.merged_from) do
      json.ordered({ "dir", "shard", "cells", "threads", "manifest_sha256" }, m)
    end
  end
  return doc
end

-- The text a manifest carries into figures, titles and file names. A manifest may come from another
-- job (the shards of a cluster run), so what it says is checked here, where it is read: labels
-- printable (no control byte, valid UTF-8, as ember writes them), stages among the per-layer stages
-- (a stage names a file), the metric among the known kinds.
local function label_fields(doc)
  local out = { { "metric.label", doc.metric.label } }
  for _, run in ipairs({ "clean", "corrupted" }) do
    for i, t in ipairs(type(doc[run].tokens) == "table" and doc[run].tokens or {}) do
      out[#out + 1] = { string.format("%s.tokens[%d]", run, i - 1), t }
    end
  end
  for i, t in ipairs(type(doc.grid.position_labels) == "table" and doc.grid.position_labels or {}) do
    out[#out + 1] = { string.format("grid.position_labels[%d]", i - 1), t }
  end
  return out
end

local function check_text(doc, where)
  for _, f in ipairs(label_fields(doc)) do
    if not token_label.is_printable(f[2]) then
      fail("%s: %s is %s (a label must be printable text: no control byte, valid UTF-8); the manifest was not "
        .. "written by ember", where, f[1], type(f[2]) == "string" and ("'" .. token_label.printable(f[2]) .. "'")
        or "not a string")
    end
  end
  if type(doc.grid.stages) ~= "table" then fail("%s: missing or invalid 'grid.stages'", where) end
  for i, st in ipairs(doc.grid.stages) do
    if not selectors.RESIDUAL_LAYER_STAGE_SET[st] then
      fail("%s: grid.stages[%d] is '%s', not a per-layer stage (%s); the manifest was not written by ember", where,
        i - 1, token_label.printable(st), table.concat(selectors.RESIDUAL_LAYER_STAGES, ", "))
    end
  end
  if doc.metric.tokens ~= nil and type(doc.metric.tokens) ~= "table" then
    fail("%s: metric.tokens is not a list; the manifest was not written by ember", where)
  end
  for i, t in ipairs(type(doc.metric.tokens) == "table" and doc.metric.tokens or {}) do
    if math.type(t) ~= "integer" then fail("%s: metric.tokens[%d] is not a token id", where, i - 1) end
  end
  local kinds = sweep_metric.KINDS
  local known = false
  for _, k in ipairs(kinds) do known = known or doc.metric.kind == k end
  if not known then
    fail("%s: metric.kind is '%s' (expected %s); the manifest was not written by ember", where,
      token_label.printable(doc.metric.kind), table.concat(kinds, ", "))
  end
end

-- grid_cells(grid, where) -> the cells of grid.shape: three counts, the lengths of grid.stages,
-- grid.layers and grid.positions, at most MAX_CELLS in all; raises naming `where` otherwise.
function M.grid_cells(grid, where)
  local shape = grid.shape
  if type(shape) ~= "table" or #shape ~= 3 then fail("%s: grid.shape must be [stages, layers, positions]", where) end
  local n = shapes.check(shape, M.MAX_CELLS, where .. ": grid")
  for i, list in ipairs({ "stages", "layers", "positions" }) do
    if type(grid[list]) ~= "table" or #grid[list] ~= shape[i] then
      fail("%s: grid.shape[%d] = %s, but grid.%s lists %s", where, i - 1, tostring(shape[i]), list,
        type(grid[list]) == "table" and #grid[list] or "nothing")
    end
  end
  return n
end

-- check_cell(c, cw, doc, n, seen): a cell of a manifest read from disk is an object whose fields
-- have the kinds M.cell and the comparisons use; raises naming the cell (cw) otherwise.
local function check_cell(c, cw, doc, n, seen)
  if type(c) ~= "table" then fail("%s: not an object", cw) end
  if math.type(c.index) ~= "integer" or c.index < 0 or c.index >= n then fail("%s: index outside the grid", cw) end
  if seen[c.index] then fail("%s: cell index %d appears twice", cw, c.index) end
  seen[c.index] = true
  if c.settings_sha256 ~= doc.settings_sha256 then fail("%s: settings_sha256 differs from the sweep's", cw) end
  for _, k in ipairs({ "value", "recovered" }) do -- a value always; recovered may be null (no gap to close)
    local v = c[k]
    local absent = k == "recovered" and (v == nil or v == json.null)
    if not (absent or type(v) == "number" or v == "NaN" or v == "Infinity" or v == "-Infinity") then
      fail("%s: %s is not a number", cw, k)
    end
  end
  if c.source ~= nil and type(c.source) ~= "table" then fail("%s: source is not an object", cw) end
  if c.generated_ids ~= nil and type(c.generated_ids) ~= "table" then fail("%s: generated_ids is not a list", cw) end
  if c.values ~= nil then
    if type(c.values) ~= "table" then fail("%s: values is not a list", cw) end
    for i, v in ipairs(c.values) do
      if not (type(v) == "number" or v == "NaN" or v == "Infinity" or v == "-Infinity") then
        fail("%s: values[%d] is not a number", cw, i - 1)
      end
    end
  end
  for _, k in ipairs({ "layer", "position" }) do
    if math.type(c[k]) ~= "integer" then fail("%s: %s is not an integer", cw, k) end
  end
end

-- read(dir [, opts]) -> { dir, manifest, cells }. Verifies the schema, the cells (fields, indices
-- inside the grid, no duplicates) and, for a complete sweep, the grid file's sha256.
function M.read(dir, opts)
  local where = "sweep '" .. dir .. "'"
  if not fs.is_dir(dir) then fail("%s: not a directory", where) end
  local path = fs.join(dir, M.MANIFEST)
  if not fs.exists(path) then fail("%s: %s is missing (not a sweep output)", where, M.MANIFEST) end
  local doc = json.decode(fs.read(path, where, M.MAX_MANIFEST_BYTES), where .. ": " .. M.MANIFEST)
  if type(doc) ~= "table" or doc.schema ~= M.SCHEMA then
    fail("%s: %s is not an ember sweep (schema '%s')", where, M.MANIFEST, tostring(type(doc) == "table" and doc.schema))
  end
  if type(doc.schema_version) ~= "string" or not doc.schema_version:match("^1%.%d+%.%d+$") then
    fail("%s: unsupported schema_version '%s' (this ember reads 1.x)", where, tostring(doc.schema_version))
  end
  for _, k in ipairs({ "model", "clean", "corrupted", "metric", "grid", "execution", "cells" }) do
    if type(doc[k]) ~= "table" then fail("%s: missing or invalid '%s'", where, k) end
  end
  check_text(doc, where)
  local n = M.grid_cells(doc.grid, where)
  local cells, seen = {}, {}
  for i, c in ipairs(doc.cells) do
    check_cell(c, string.format("%s: cell %d", where, i - 1), doc, n, seen)
    c.value = float(c.value)
    c.recovered = float(c.recovered)
    cells[#cells + 1] = M.cell(c)
  end
  doc.cells = nil
  restore_shape(doc)
  if not (opts and opts.partial_ok) then
    if doc.status ~= "complete" then fail("%s: status is '%s' (an interrupted run; rerun it to resume)", where,
      tostring(doc.status)) end
    local blob = fs.read(fs.join(dir, M.GRID), where .. ": " .. M.GRID, M.MAX_GRID_BYTES)
    if type(doc.grid_file) ~= "table" or sha256(blob) ~= doc.grid_file.sha256 then
      fail("%s: sha256 of %s does not match the manifest", where, M.GRID)
    end
  end
  return { dir = dir, manifest = doc, cells = cells }
end

-- read_for_resume(dir, doc) -> previous { cells } when `dir` holds part of the same sweep, nil when
-- `dir` does not exist or holds nothing of a sweep yet: empty (made beforehand, or left by a run that
-- failed at its first write: disk full, killed), or with only ember's own leftovers (a grid file
-- whose manifest was never written, temporaries). Raises naming the field when it holds another
-- sweep, and naming the entries when it holds files that are not a sweep's.
function M.read_for_resume(dir, doc)
  if not fs.exists(dir) then return nil end
  if not fs.is_dir(dir) then fail("sweep: --out '%s' is not a directory", dir) end
  if not fs.exists(fs.join(dir, M.MANIFEST)) then
    local others = {}
    for _, name in ipairs(fs.list_dir(dir)) do
      if name ~= M.GRID and not name:find(fs.TEMP_MARK, 1, true) then others[#others + 1] = name end
    end
    if #others == 0 then return nil end -- the manifest is the truth: no manifest, no cells yet
    table.sort(others)
    fail("sweep: --out '%s' holds no sweep (no %s) but other files (%s); choose an empty or a new directory",
      dir, M.MANIFEST, table.concat(others, ", "))
  end
  local prev = M.read(dir, { partial_ok = true })
  local diffs = M.differences(doc, prev.manifest, { "shard.index", "shard.count" })
  if #diffs > 0 then
    local d = diffs[1]
    fail("sweep: --out '%s' holds another sweep (%s: %s there, %s here); choose another directory", dir, d.path,
      d.b, d.a)
  end
  return prev
end

return M
