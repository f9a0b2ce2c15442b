-- ember.run.dump — layer dumps (--dump-layers DIR: every layer's output of every evaluation) and logits
-- dumps (--dump-logits FILE: every evaluation's logits) as safetensors with a JSON sidecar.
-- Deterministic bytes: nothing in a dump depends on the time, the paths or the digest cache, so two
-- identical runs give byte-identical dumps. Written atomically. Must not intervene in a run: the
-- observer reads views only, and runs with an active experiment are refused by the callers.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local safetensors = require("ember.store.safetensors")
local core = require("ember.core")

local M = {}

M.SCHEMA_VERSION = "1.0.0"

-- Views are not held in memory: each one's bytes are appended to a spill file as it is seen (one
-- per layer, in the temporary directory that becomes DIR; one beside the logits FILE), and the
-- writers put the safetensors header in front of them. A long prompt's dump then costs disk, not
-- RAM; the bytes are the same as if the views had been kept.
local function spill_open(path, what)
  local f, err = io.open(path, "wb")
  if not f then error(string.format("%s: cannot write '%s': %s", what, path, err), 0) end
  return f
end

local function spill_write(sp, view, what)
  local ok, err = view:write_bytes(sp.file)
  if not ok then error(string.format("%s: cannot write '%s': %s", what, sp.path, tostring(err)), 0) end
end

-- observer{ layers = DIR | nil, logits = FILE | nil } -> an experiment table that keeps the
-- after_layer view of every layer (layers) and the after_logits view (logits) of every
-- evaluation, spilled to disk as described above. Evaluations are numbered from 1 in the order
-- they run (one prefill, then one per decode). exp:discard() removes the spills (a failed run).
function M.observer(cfg)
  local exp = { name = "dump", evals = {}, layers = {}, logits = {}, spills = {}, stats = { evaluations = 0 } }
  local function eval_of(self, ctx)
    local e = self.evals[#self.evals]
    if e == nil or e.start_position ~= ctx.start_position then
      e = { eval = #self.evals + 1, phase = ctx.phase, start_position = ctx.start_position,
        tokens = ctx.input_token_count }
      self.evals[#self.evals + 1] = e
      self.stats.evaluations = #self.evals
    end
    return e
  end
  local function record(list, sp, view, e, what)
    local shape = view:shape()
    spill_write(sp, view, what)
    list[#list + 1] = { eval = e.eval, rows = shape[1], cols = shape[2], size = #view * 4,
      fingerprint = view:fingerprint() }
  end
  if cfg.layers then
    local dir = (cfg.layers:gsub("(.)/+$", "%1"))
    function exp:after_layer(ctx, view)
      local e = eval_of(self, ctx)
      local l = ctx.layer_index
      if not self.layer_dir then -- the directory that becomes DIR, made on the first view (a killed
        -- dump's leftovers beside it are swept first)
        self.layer_dir = fs.temp_dir_beside(dir, "--dump-layers")
      end
      if not self.layers[l] then
        local path = fs.join(self.layer_dir, string.format(".layer_%02d.spill", l))
        self.layers[l] = { spill = { path = path, file = spill_open(path, "--dump-layers") } }
        self.spills[#self.spills + 1] = self.layers[l].spill
      end
      record(self.layers[l], self.layers[l].spill, view, e, "--dump-layers")
    end
  end
  if cfg.logits then
    function exp:after_logits(ctx, view)
      local e = eval_of(self, ctx)
      if not self.logits.spill then
        fs.sweep_temps(fs.dirname(cfg.logits)) -- a killed dump's spill goes first
        local path = fs.temp_sibling(cfg.logits)
        self.logits.spill = { path = path, file = spill_open(path, "--dump-logits") }
        self.spills[#self.spills + 1] = self.logits.spill
      end
      record(self.logits, self.logits.spill, view, e, "--dump-logits")
    end
  end
  function exp:discard()
    for _, sp in ipairs(self.spills) do
      if sp.file then sp.file:close(); sp.file = nil end
      os.remove(sp.path)
    end
    if self.layer_dir then fs.remove_tree(self.layer_dir) end
  end
  return exp
end

local function hex64(fp) return string.format("%016x", fp) end
local function tensor_name(eval) return string.format("eval_%04d", eval) end

-- provenance(model, prompt_text, tokenizer_path, gen, out) -> what the dump was computed from,
-- without what differs between identical runs (paths, time, where the digest came from).
function M.provenance(model, prompt_text, tokenizer_path, gen, out)
  local manifest = require("ember.store.manifest")
  local info = model.info
  local sha = manifest.model_sha256(model)
  local tok = manifest.tokenizer_section(tokenizer_path, sha)
  if tok.path then tok.path = nil end
  return json.ordered({ "tool", "model", "tokenizer", "prompt", "input_ids", "generated_ids", "settings",
    "execution", "intervention" }, {
    tool = json.ordered({ "name", "version" }, { name = "ember", version = core.version }),
    model = json.ordered({ "sha256", "family", "architecture", "name", "n_layers", "hidden_size", "n_vocab",
      "dtype_summary" }, {
      sha256 = sha, family = info.family, architecture = info.architecture, name = info.name,
      n_layers = info.n_layers, hidden_size = info.hidden_size, n_vocab = info.n_vocab,
      dtype_summary = info.dtype_summary }),
    tokenizer = tok,
    prompt = manifest.prompt_section(prompt_text, out.prompt_ids, false),
    input_ids = json.array({ table.unpack(out.prompt_ids) }),
    generated_ids = json.array({ table.unpack(out.ids) }),
    settings = manifest.settings_section(gen or {}),
    execution = json.ordered({ "kernels", "kv_cache" }, { kernels = info.kernels, kv_cache = info.kv_cache or "f32" }),
    -- dumps never run under an experiment (the command line refuses the combination)
    intervention = "none",
  })
end

local function evaluations(exp)
  local list = json.array()
  for i, e in ipairs(exp.evals) do
    list[i] = json.ordered({ "eval", "phase", "start_position", "tokens" }, e)
  end
  return list
end

local COPY_CHUNK = 4 * 1024 * 1024

-- Writes one safetensors file at `path`: the header of entries { eval, rows, cols, size } (in
-- order), then the spill's bytes, which are removed. Returns the file's sha256 and the tensor list.
local function write_spilled(path, entries, sp, kind, extra, what)
  local tensors, listed = {}, json.array()
  for i, r in ipairs(entries) do
    tensors[i] = { name = tensor_name(r.eval), shape = { r.rows, r.cols }, size = r.size }
    listed[i] = json.ordered({ "name", "eval", "shape", "fingerprint" }, {
      name = tensors[i].name, eval = r.eval, shape = json.array({ r.rows, r.cols }),
      fingerprint = hex64(r.fingerprint) })
  end
  local meta = { format = kind, schema_version = M.SCHEMA_VERSION }
  for k, v in pairs(extra or {}) do meta[k] = v end
  local out = spill_open(path, what)
  local function put(bytes)
    local ok, err = out:write(bytes)
    if not ok then
      out:close()
      error(string.format("%s: cannot write '%s': %s", what, path, tostring(err)), 0)
    end
  end
  put(safetensors.header(tensors, meta))
  if sp then
    sp.file:close()
    sp.file = nil
    local src, err = io.open(sp.path, "rb")
    if not src then
      out:close()
      error(string.format("%s: cannot read back '%s': %s", what, sp.path, err), 0)
    end
    while true do
      local chunk = src:read(COPY_CHUNK)
      if not chunk then break end
      put(chunk)
    end
    src:close()
    os.remove(sp.path)
  end
  local ok, err = out:flush()
  out:close()
  if not ok then error(string.format("%s: cannot write '%s': %s", what, path, tostring(err)), 0) end
  local sha, serr = core.sha256_file(path)
  if not sha then error(string.format("%s: cannot read back '%s': %s", what, path, tostring(serr)), 0) end
  return sha, listed
end

local function sidecar(kind, prov, exp, files)
  return json.encode(json.ordered({ "schema", "schema_version", "observation_only", "provenance", "evaluations",
    "files" }, {
    schema = kind, schema_version = M.SCHEMA_VERSION, observation_only = true, provenance = prov,
    evaluations = evaluations(exp), files = files,
  }), { indent = "  " }) .. "\n"
end

-- write_layers(dir, exp, prov, n_layers): DIR/layer_NN.safetensors (tensor eval_NNNN: that layer's
-- output [rows, hidden] of evaluation NNNN) and DIR/dump.json; the directory appears whole (built
-- beside it, then renamed). Returns the sidecar's path.
function M.write_layers(dir, exp, prov, n_layers)
  if fs.exists(dir) then
    exp:discard()
    error(string.format("--dump-layers: '%s' already exists", dir), 0)
  end
  local tmp = exp.layer_dir
  if not tmp then -- no evaluation reached a layer: the dump is empty but still whole
    tmp = fs.temp_dir_beside((dir:gsub("(.)/+$", "%1")), "--dump-layers")
    exp.layer_dir = tmp
  end
  local files = json.array()
  local wrote, werr = pcall(function()
    for l = 0, n_layers - 1 do
      local name = string.format("layer_%02d.safetensors", l)
      local entries = exp.layers[l] or {}
      local sha, listed = write_spilled(fs.join(tmp, name), entries, entries.spill, "ember.layer_dump",
        { layer = tostring(l) }, "--dump-layers")
      files[#files + 1] = json.ordered({ "layer", "file", "sha256", "tensors" },
        { layer = l, file = name, sha256 = sha, tensors = listed })
    end
    fs.write_atomic(fs.join(tmp, "dump.json"), sidecar("ember.layer_dump", prov, exp, files), "--dump-layers")
  end)
  if not wrote then
    exp:discard()
    error(werr, 0)
  end
  local rok, rerr = os.rename(tmp, dir)
  if not rok then
    exp:discard()
    error(string.format("--dump-layers: cannot move into place '%s': %s", dir, rerr), 0)
  end
  exp.layer_dir = nil
  return fs.join(dir, "dump.json")
end

-- The sidecar of a logits dump: FILE.safetensors -> FILE.json (else FILE.json beside FILE).
function M.logits_sidecar(path) return (path:gsub("%.safetensors$", "")) .. ".json" end

-- write_logits(path, exp, prov): PATH (tensor eval_NNNN: the logits [1, n_vocab] of evaluation NNNN)
-- and its sidecar, each written atomically.
function M.write_logits(path, exp, prov)
  local tmp = fs.temp_sibling(path)
  local wrote, sha, listed = pcall(write_spilled, tmp, exp.logits, exp.logits.spill, "ember.logits_dump", nil,
    "--dump-logits")
  if not wrote then
    os.remove(tmp)
    exp:discard()
    error(sha, 0)
  end
  local rok, rerr = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    error(string.format("--dump-logits: cannot move into place '%s': %s", path, rerr), 0)
  end
  local files = json.array({ json.ordered({ "file", "sha256", "tensors" },
    { file = fs.basename(path), sha256 = sha, tensors = listed }) })
  local side = M.logits_sidecar(path)
  fs.write_atomic(side, sidecar("ember.logits_dump", prov, exp, files), "--dump-logits")
  return side
end

return M
