-- fuzz/drivers/formats.lua — structure-aware fuzzing of the files ember reads, past their checksums.
-- Must not weaken a reader to let inputs through: it makes inputs that pass the digest gates.
--
-- The input is not the file: its first byte picks a format, the rest is a stream of decisions that
-- build a well-formed base document and then mutate it where the format has structure (a JSON
-- value replaced by a boundary number, a hostile string, null, an empty table; a key dropped; a
-- shape, dtype, offset or header field changed; an SAE's config, weights headers or ZIP records).
-- Every digest the format carries is then computed
-- again over the mutated content (tensor sha256s, record_sha256, the tensor file's and the grid
-- file's sha256, the prompt's), so the reader's later checks and the code behind them see the
-- mutation instead of stopping at the first sha256 mismatch. A reader must accept the input or
-- raise a message that names the file; what it accepts must then behave (an artifact compares
-- "exact" with itself, a sweep equals itself, a tensor has the shape its header declared).
local core = require("ember.core")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local safetensors = require("ember.store.safetensors")
local artifact = require("ember.store.artifact")

local dir = fs.make_temp_dir("ember-fuzz-formats") -- private (0700), no shell
-- the sample artifact's sections (fuzz/artifact_sections.lua, shared with the seeds), loaded once:
-- each call makes a fresh table
local new_sections = assert(loadfile((debug.getinfo(1, "S").source:match("^@(.*)/drivers/[^/]*$") or "fuzz")
  .. "/artifact_sections.lua"))

local function put(name, bytes)
  local f = assert(io.open(dir .. "/" .. name, "wb"))
  f:write(bytes)
  f:close()
end

local function sha256(s) return core.sha256(s) end

-- ---- the decision stream ------------------------------------------------------------------------

local D = {}
D.__index = D
local function stream(s) return setmetatable({ s = s, i = 1 }, D) end
function D:byte()
  local b = self.s:byte(self.i) or 0
  self.i = self.i + 1
  return b
end
function D:below(n) return n <= 1 and 0 or (self:byte() * 256 + self:byte()) % n end
function D:pick(list) return list[self:below(#list) + 1] end
function D:chance(k) return self:byte() < k end -- k of 256
function D:bytes(n) -- up to n raw bytes of the stream
  local m = self:below(n + 1)
  local out = self.s:sub(self.i, self.i + m - 1)
  self.i = self.i + m
  return out
end

local BOUNDARY = { 0, 1, -1, 2, 3, 7, 255, 256, 65535, 65536, (1 << 31) - 1, 1 << 31, 1 << 32, (1 << 32) + 1,
  1 << 53, (1 << 62), math.maxinteger, math.mininteger, 0.5, -0.0, 1e308, -1e308, 4.9e-324 }
local HOSTILE = { "", " ", "\n!id > PWNED\n", "a\0b", "\27[2J", "\255\254", string.rep("x", 5000), "../../etc",
  "%s%d%n", "'\"`$(touch x)`", "null", "after_mlp", "prefill", "decode", "f32", "little", "F32", "logistic" }

function D:number() return self:pick(BOUNDARY) end
function D:count() -- an integer boundary, for sizes written as unsigned fields
  local v
  repeat v = self:pick(BOUNDARY) until math.type(v) == "integer"
  return v & 0x7fffffffffffffff
end
function D:string() return self:chance(200) and self:pick(HOSTILE) or self:bytes(24) end

-- a value of any JSON kind, nested at most `depth` deep
function D:value(depth)
  local k = self:below(depth > 0 and 7 or 5)
  if k == 0 then return self:number() end
  if k == 1 then return self:string() end
  if k == 2 then return json.null end
  if k == 3 then return self:chance(128) end
  if k == 4 then return self:below(8) end
  if k == 5 then return json.array({ self:value(depth - 1), self:value(depth - 1) }) end
  return { [self:string()] = self:value(depth - 1) }
end

-- ---- JSON structure mutations ------------------------------------------------------------------

-- the tables inside t (t included), and the keys of each
local function containers(t, out)
  out = out or {}
  out[#out + 1] = t
  for _, v in pairs(t) do if type(v) == "table" then containers(v, out) end end
  return out
end

local function keys_of(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  return ks
end

-- applies 1..4 mutations to the decoded JSON document t, in place
local function mutate_json(t, d)
  for _ = 1, 1 + d:below(4) do
    local all = containers(t)
    local c = all[d:below(#all) + 1]
    local ks = keys_of(c)
    local op = d:below(6)
    if #ks == 0 or op == 0 then
      c[#c > 0 and #c + 1 or d:string()] = d:value(2) -- a new element or key
    else
      local key = ks[d:below(#ks) + 1]
      if op == 1 then c[key] = nil
      elseif op == 2 then c[key] = d:value(2)
      elseif op == 3 then c[key] = d:number()
      elseif op == 4 then c[key] = d:string()
      else -- another entry's value in its place (a swap within the container)
        local other = ks[d:below(#ks) + 1]
        c[key], c[other] = c[other], c[key]
      end
    end
  end
end

-- encode(t) -> JSON text, or nil when the mutation made something JSON cannot hold
local function encode(t)
  local ok, text = pcall(json.encode, t)
  return ok and text or nil
end

-- ---- the formats --------------------------------------------------------------------------------

local function f32(n, seed)
  local parts = {}
  for i = 1, n do parts[i] = string.pack("<f", ((i * 37 + seed) % 17) / 4 - 2) end
  return table.concat(parts)
end

local function expect_named(ok, err, name, what)
  if not ok and (type(err) ~= "string" or not err:find(name, 1, true)) then
    error(what .. " raised an error that does not name its input: " .. tostring(err), 0)
  end
end

-- an activation artifact: the real writer's output, its manifest mutated, digests recomputed
local function fuzz_artifact(d)
  local sections = new_sections()
  local stages = { "after_attention", "after_mlp", "after_layer", "before_layer" }
  local records = {}
  for i = 1, 1 + d:below(3) do
    local rows, cols = 1 + d:below(3), 1 + d:below(4)
    records[i] = { stage = d:pick(stages), layer = d:below(2), phase = i == 1 and "prefill" or "decode",
      start_position = i == 1 and 0 or i, shape = { rows, cols }, data = f32(rows * cols, i) }
  end
  if d:chance(64) then records[#records + 1] = { stage = "after_logits", phase = "prefill", start_position = 0,
    shape = { 1, 4 }, data = f32(4, 9) } end
  local art = dir .. "/art"
  fs.remove_tree(art)
  artifact.write(art, sections, records)
  local m = json.decode(fs.read(art .. "/manifest.json", "seed", 1 << 20))
  local blob = fs.read(art .. "/tensors.safetensors", "seed", 1 << 20)
  local st = safetensors.decode(blob, "seed")
  if d:chance(192) then mutate_json(m, d) end
  -- the tensor file: a shape or an offset of its header changed, or a tensor's bytes cut
  local tensors = {}
  for _, name in ipairs(st.names) do
    local e = st.tensors[name]
    local shape = { table.unpack(e.shape) }
    if d:chance(40) then shape[d:below(#shape) + 1] = d:pick(BOUNDARY) end
    local data = e.data
    if d:chance(20) then data = data:sub(1, d:below(#data + 1)) end
    tensors[#tensors + 1] = { name = d:chance(16) and d:string() or name, shape = shape, data = data }
  end
  local ok_blob, new_blob = pcall(safetensors.encode, tensors, { format = "pt" })
  if ok_blob then blob = new_blob end
  -- every digest again, over what the files now hold
  local by_name = {}
  for _, t in ipairs(tensors) do by_name[t.name] = t.data end
  if type(m.records) == "table" then
    for _, r in ipairs(m.records) do
      if type(r) == "table" and type(r.name) == "string" and by_name[r.name] then
        r.sha256 = sha256(by_name[r.name])
        local okd, digest = pcall(artifact.record_digest, { stage = r.stage, layer = r.layer ~= json.null and r.layer
          or nil, phase = r.phase, start_position = r.start_position, shape = r.shape }, r.name, r.sha256)
        if okd then r.record_sha256 = digest end
      end
    end
  end
  if type(m.tensor_file) == "table" then m.tensor_file.sha256 = sha256(blob) end
  if type(m.prompt) == "table" and type(m.prompt.text) == "string" then m.prompt.sha256 = sha256(m.prompt.text) end
  local text = encode(m)
  if not text then return end
  put("art/manifest.json", text)
  put("art/tensors.safetensors", blob)
  local ok, a = pcall(artifact.read, art)
  expect_named(ok, a, "artifact '" .. art .. "'", "artifact.read")
  if ok then -- what the reader accepted compares exact with itself
    local res = require("ember.analysis.compare").compare(a, a)
    if res.class ~= "exact" then error("an artifact read back does not compare exact with itself: " .. res.class, 0) end
  end
end

-- a NumPy .npy: header fields and data length from the stream
local function fuzz_npy(d)
  local descr = d:pick({ "<f4", "<f2", ">f4", "<f8", "|u1", "", "<f4'" })
  local dims = {}
  for i = 1, d:below(4) do dims[i] = d:chance(200) and (1 + d:below(6)) or d:pick(BOUNDARY) end
  local shape = #dims == 1 and (tostring(dims[1]) .. ",") or table.concat((function()
    local t = {}
    for i, v in ipairs(dims) do t[i] = math.type(v) == "integer" and string.format("%d", v) or tostring(v) end
    return t
  end)(), ", ")
  local header = string.format("{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }", descr,
    d:pick({ "False", "True", "0" }), shape)
  if d:chance(30) then header = d:string() end
  local major = d:pick({ 1, 1, 1, 2, 3, 4 })
  header = header .. string.rep(" ", (64 - (#header + 11) % 64) % 64) .. "\n"
  local len = major == 1 and string.pack("<I2", #header % 65536) or string.pack("<I4", #header)
  local n = 1
  for _, v in ipairs(dims) do n = (math.type(v) == "integer" and v > 0 and v < 64) and n * v or n end
  local size = descr == "<f2" and 2 or 4
  local data = f32((n * size + 3) // 4, 1):sub(1, n * size)
  if d:chance(40) then data = data:sub(1, d:below(#data + 1)) .. d:bytes(8) end
  local bytes = "\147NUMPY" .. string.char(major, 0) .. len .. header .. data
  local vf = require("ember.store.vector_file")
  local ok, t, h = pcall(vf.npy_tensor, bytes, "npy 'fuzz'")
  expect_named(ok, t, "npy 'fuzz'", "npy_tensor")
  if ok then
    local sh = t:shape()
    if sh[1] ~= h.rows or sh[2] ~= h.cols or #t ~= h.rows * h.cols then
      error("npy_tensor: the tensor's shape differs from its header's", 0)
    end
  end
end

-- a safetensors file: entries (dtype, shape, offsets) and metadata from the stream
local function fuzz_safetensors(d)
  local header, data, offset = {}, {}, 0
  for i = 1, d:below(4) do
    local rows, cols = 1 + d:below(3), 1 + d:below(5)
    local bytes = f32(rows * cols, i)
    local shape = { rows, cols }
    if d:chance(50) then shape[d:below(2) + 1] = d:pick(BOUNDARY) end
    if d:chance(20) then shape = { rows * cols } end
    local e = { dtype = d:chance(220) and "F32" or d:pick({ "F16", "BF16", "I8", "F64", "Q8", "" }),
      shape = json.array(shape), data_offsets = json.array({ offset, offset + #bytes }) }
    if d:chance(30) then e.data_offsets[d:below(2) + 1] = d:pick(BOUNDARY) end
    header[d:chance(240) and ("t" .. i) or d:string()] = e
    data[#data + 1] = bytes
    offset = offset + #bytes
  end
  if d:chance(60) then header.__metadata__ = { [d:string()] = d:chance(200) and d:string() or d:value(1) } end
  if d:chance(40) then mutate_json(header, d) end
  local text = encode(header)
  if not text then return end
  local bytes = string.pack("<I8", d:chance(240) and #text or d:count()) .. text
    .. table.concat(data)
  local ok, st = pcall(safetensors.decode, bytes, "safetensors 'fuzz'")
  expect_named(ok, st, "safetensors 'fuzz'", "safetensors.decode")
  put("t.safetensors", bytes)
  local okl, got = pcall(require("ember.store.tensor_file").load, dir .. "/t.safetensors")
  expect_named(okl, got, dir .. "/t.safetensors", "load_tensors")
end

-- a sweep store: a small grid's manifest and grid file, mutated, the grid's sha256 recomputed
local function fuzz_sweep(d)
  local store = require("ember.sweep.store")
  local settings = string.rep("e", 64)
  local run = { prompt = { sha256 = sha256("a"), source = "text", text = "a", withheld = false, token_count = 2 },
    input_ids = json.array({ 1, 2 }), tokens = json.array({ "a", "b" }), logits_sha256 = string.rep("f", 64), top1 = 1,
    value = 0.5 }
  local doc = {
    schema = store.SCHEMA, schema_version = store.SCHEMA_VERSION, status = "complete", created_at_unix = 1,
    tool = { name = "ember", version = "0" }, model = { path = "m", sha256 = string.rep("a", 64), family = "llama" },
    tokenizer = { source = "gguf", sha256 = string.rep("b", 64) }, clean = run,
    corrupted = { prompt = run.prompt, input_ids = run.input_ids, tokens = run.tokens,
      logits_sha256 = run.logits_sha256, top1 = 2, value = -0.5 },
    metric = { kind = "logit-diff", tokens = json.array({ 1, 2 }), label = "logit-diff" },
    grid = { stages = json.array({ "after_layer" }), layers = json.array({ 0, 1 }), positions = json.array({ 0, 1 }),
      shape = json.array({ 1, 2, 2 }), order = "stage,layer,position", position_labels = json.array({ "0 a", "1 b" }),
      phase = "prefill" },
    settings_sha256 = settings, shard = json.null, execution = { kernels = "reference", threads = 1 },
    argv = json.array({ "ember" }),
  }
  local cells = json.array()
  for i = 0, 3 do
    cells[i + 1] = store.cell { index = i, stage = "after_layer", layer = i // 2, position = i % 2, value = i / 4,
      recovered = i / 3, certified = i == 0, top1 = 1, logits_sha256 = string.rep("c", 64),
      source_sha256 = string.rep("d", 64), source_row = i % 2, settings_sha256 = settings }
  end
  doc.cells = cells
  if d:chance(200) then mutate_json(doc, d) end
  local okb, blob = pcall(store.grid_blob, doc, type(doc.cells) == "table" and doc.cells or {})
  if not okb then blob = d:bytes(64) end
  doc.grid_file = { name = store.GRID, size = #blob, sha256 = sha256(blob) }
  local text = encode(doc)
  if not text then return end
  fs.remove_tree(dir .. "/sweep")
  assert(fs.mkdir(dir .. "/sweep"))
  put("sweep/" .. store.MANIFEST, text)
  put("sweep/" .. store.GRID, blob)
  local where = "sweep '" .. dir .. "/sweep'"
  local ok, s = pcall(store.read, dir .. "/sweep", { partial_ok = d:chance(128) })
  expect_named(ok, s, where, "sweep store.read")
  if ok and #s.cells > 0 then -- (with no cells nothing is compared, and compare says not equal)
    local res = require("ember.sweep.merge").compare(s, s)
    if not res.equal then error("a sweep read back does not equal itself", 0) end
  end
end

-- a probe file
local function fuzz_probe(d)
  local probe = require("ember.analysis.probe")
  local h = 1 + d:below(4)
  local function vec(n, x) local t = json.array() for i = 1, n do t[i] = x + i / 8 end return t end
  local doc = { schema = probe.SCHEMA, schema_version = probe.SCHEMA_VERSION, kind = "logistic",
    classes = json.array({ "no", "yes" }), hidden_size = h, layer = d:below(3), pool = "last",
    standardize = { mean = vec(h, 0), std = vec(h, 1) }, weights = json.array({ vec(h, -1) }), bias = vec(1, 0),
    model = { sha256 = string.rep("a", 64), path = "m.gguf" } }
  if d:chance(128) then
    doc.kind, doc.classes, doc.weights, doc.bias = "softmax", json.array({ "a", "b", "c" }),
      json.array({ vec(h, 1), vec(h, 2), vec(h, 3) }), vec(3, 0)
  end
  mutate_json(doc, d)
  local text = encode(doc)
  if not text then return end
  local ok, p = pcall(probe.decode, text, "--probe 'fuzz'")
  expect_named(ok, p, "--probe 'fuzz'", "probe.decode")
end

-- a llama.cpp control vector: a GGUF written here from the stream (key and tensor tables, types,
-- dimensions, offsets), read by the engine's control-vector reader
local function fuzz_control_vector(d)
  local function str(s) return string.pack("<I8", #s) .. s end
  local kv, n_kv = {}, 0
  local function add_kv(key, t, payload) kv[#kv + 1] = str(key) .. string.pack("<I4", t) .. payload; n_kv = n_kv + 1 end
  add_kv("general.architecture", 8, str(d:chance(230) and "controlvector" or d:string()))
  if d:chance(200) then add_kv("controlvector.model_hint", 8, str(d:string())) end
  if d:chance(200) then add_kv("controlvector.layer_count", d:pick({ 4, 5, 8, 10 }),
    d:chance(200) and string.pack("<I4", d:below(40)) or string.pack("<I8", d:count())) end
  local n_embd = d:chance(220) and 4 or d:count()
  local infos, data, offset = {}, {}, 0
  local n_t = d:below(5)
  for i = 1, n_t do
    local name = d:chance(220) and ("direction." .. (d:chance(230) and tostring(i) or d:string())) or d:string()
    local ne = d:chance(230) and n_embd or d:count()
    local n_dims = d:chance(230) and 1 or d:pick({ 0, 2, 4, 5 })
    local ty = d:chance(230) and 0 or d:pick({ 1, 8, 30, 99 })
    local dims = ""
    for k = 1, math.min(n_dims, 4) do dims = dims .. string.pack("<I8", k == 1 and ne or 1) end
    local off = d:chance(230) and offset or d:count()
    infos[#infos + 1] = str(name) .. string.pack("<I4", n_dims) .. dims .. string.pack("<I4I8", ty, off)
    local bytes = f32(4, i)
    data[#data + 1] = bytes .. string.rep("\0", (32 - #bytes % 32) % 32)
    offset = offset + #data[#data]
  end
  local head = "GGUF" .. string.pack("<I4I8I8", 3, n_t, n_kv) .. table.concat(kv) .. table.concat(infos)
  head = head .. string.rep("\0", (32 - #head % 32) % 32)
  local bytes = head .. table.concat(data)
  if d:chance(30) then bytes = bytes:sub(1, d:below(#bytes + 1)) end
  put("cv.gguf", bytes)
  local path = dir .. "/cv.gguf"
  local ok, cv = pcall(core.read_control_vector, path)
  expect_named(ok, cv, path, "read_control_vector")
end

-- ---- SAE files (docs/sae.md) ----------------------------------------------------------------------

-- safetensors bytes of entries { name, dtype, shape, data }, each field possibly mutated by the
-- stream: a dimension replaced by a boundary number, the dtype changed, the name, an offset
local function sae_safetensors(d, entries)
  local header, data, offset = {}, {}, 0
  for _, e in ipairs(entries) do
    local shape = { table.unpack(e.shape) }
    if d:chance(24) then shape[d:below(#shape) + 1] = d:pick(BOUNDARY) end
    if d:chance(12) then shape[#shape + 1] = 1 + d:below(3) end
    local dtype = d:chance(236) and e.dtype or d:pick({ "F16", "BF16", "F64", "I8", "", "f32" })
    local offsets = json.array({ offset, offset + #e.data })
    if d:chance(12) then offsets[d:below(2) + 1] = d:pick(BOUNDARY) end
    header[d:chance(246) and e.name or d:string()] = { dtype = dtype, shape = json.array(shape),
      data_offsets = offsets }
    data[#data + 1] = e.data
    offset = offset + #e.data
  end
  if d:chance(30) then mutate_json(header, d) end
  local text = encode(header)
  if not text then return nil end
  local bytes = string.pack("<I8", #text) .. text .. table.concat(data)
  if d:chance(10) then bytes = bytes:sub(1, d:below(#bytes + 1)) end
  return bytes
end

-- the weights of an SAE with d_in inputs and d_sae features (and d_out outputs) for an
-- architecture, as SAELens names them
local function saelens_weights(arch, d_in, d_sae, d_out)
  local w = { { name = "W_enc", shape = { d_in, d_sae } }, { name = "W_dec", shape = { d_sae, d_out } },
    { name = "b_dec", shape = { d_out } } }
  if arch == "gated" then
    for _, n in ipairs({ "b_gate", "b_mag", "r_mag" }) do w[#w + 1] = { name = n, shape = { d_sae } } end
  else
    w[#w + 1] = { name = "b_enc", shape = { d_sae } }
  end
  if arch == "jumprelu" or arch == "jumprelu_transcoder" then w[#w + 1] = { name = "threshold", shape = { d_sae } } end
  for i, e in ipairs(w) do
    e.dtype = "F32"
    e.data = f32(#e.shape == 2 and e.shape[1] * e.shape[2] or e.shape[1], i)
  end
  return w
end

local function sae_saelens(d, root)
  local arch = d:pick({ "standard", "jumprelu", "topk", "gated", "transcoder", "jumprelu_transcoder" })
  local d_in, d_sae = 2 + d:below(4), 2 + d:below(6)
  local transcoder = arch:find("transcoder") ~= nil
  local d_out = transcoder and 2 + d:below(4) or d_in
  local cfg = { architecture = arch, d_in = d_in, d_sae = d_sae, dtype = d:pick({ "float32", "torch.float32" }),
    apply_b_dec_to_input = d:chance(128), normalize_activations = d:pick({ "none", "constant_norm_rescale",
      "layer_norm" }), hook_name = "blocks.1.hook_resid_post", hook_layer = 1, model_name = "tiny" }
  if arch == "topk" then cfg.k = 1 + d:below(d_sae) end
  if transcoder then cfg.d_out, cfg.hook_name_out = d_out, "blocks.1.hook_mlp_out" end
  if d:chance(64) then -- the v6 layout: hook and model fields under metadata
    cfg.metadata = { hook_name = cfg.hook_name, hook_layer = cfg.hook_layer, model_name = cfg.model_name }
    cfg.hook_name, cfg.hook_layer, cfg.model_name = nil, nil, nil
  end
  if d:chance(200) then mutate_json(cfg, d) end
  local text = encode(cfg)
  local weights = sae_safetensors(d, saelens_weights(arch, d_in, d_sae, d_out))
  if not text or not weights then return nil end
  put("sae/cfg.json", text)
  put("sae/sae_weights.safetensors", weights)
  if d:chance(40) then
    local sp = sae_safetensors(d, { { name = "sparsity", dtype = "F32", shape = { d_sae }, data = f32(d_sae, 7) } })
    if sp then put("sae/sparsity.safetensors", sp) end
  end
  return root
end

local function sae_llama_scope(d, root)
  local d_in, d_sae = 2 + d:below(4), 2 + d:below(6)
  local act = d:pick({ "jumprelu", "topk", "relu" })
  local hp = { d_model = d_in, d_sae = d_sae, hook_point_in = "blocks.1.hook_resid_post",
    hook_point_out = d:chance(200) and "blocks.1.hook_resid_post" or "blocks.1.hook_mlp_out", act_fn = act,
    jump_relu_threshold = 0.25, top_k = 1 + d:below(d_sae), norm_activation = d:pick({ "dataset-wise", "token-wise",
      "inference" }), dataset_average_activation_norm = { ["in"] = 2.5, out = 3.0 },
    apply_decoder_bias_to_pre_encoder = d:chance(128) }
  if d:chance(200) then mutate_json(hp, d) end
  local text = encode(hp)
  local entries = { { name = "encoder.weight", shape = { d_sae, d_in } },
    { name = "decoder.weight", shape = { d_in, d_sae } }, { name = "encoder.bias", shape = { d_sae } },
    { name = "decoder.bias", shape = { d_in } } }
  for i, e in ipairs(entries) do
    e.dtype = "F32"
    e.data = f32(#e.shape == 2 and e.shape[1] * e.shape[2] or e.shape[1], i)
  end
  local weights = sae_safetensors(d, entries)
  if not text or not weights then return nil end
  assert(fs.mkdir(root .. "/checkpoints"))
  put("sae/hyperparams.json", text)
  put("sae/checkpoints/final.safetensors", weights)
  return root
end

-- a NumPy array as .npy bytes, its header fields possibly mutated
local function npy_bytes(d, shape, data)
  local dims = {}
  for i, v in ipairs(shape) do dims[i] = d:chance(244) and tostring(v) or string.format("%d", d:count()) end
  local header = string.format("{'descr': '%s', 'fortran_order': False, 'shape': (%s%s), }",
    d:chance(240) and "<f4" or d:pick({ "<f2", ">f4", "<f8", "|u1" }), table.concat(dims, ", "),
    #dims == 1 and "," or "")
  if d:chance(6) then header = d:string() end
  header = header .. string.rep(" ", (64 - (#header + 11) % 64) % 64) .. "\n"
  if d:chance(10) then data = data:sub(1, d:below(#data + 1)) end
  return "\147NUMPY\1\0" .. string.pack("<I2", #header % 65536) .. header .. data
end

local has_zlib, zlib = pcall(require, "zlib")

-- a stored (uncompressed) ZIP of the named members, as np.savez writes; the CRC-32 is right where
-- lua-zlib is installed (the reader does not check it); a field of a record possibly mutated
local function zip_bytes(d, members)
  local locals, central, offset = {}, {}, 0
  for _, m in ipairs(members) do
    local crc = has_zlib and zlib.crc32()(m.data) or 0
    local method = d:chance(248) and 0 or d:pick({ 8, 12, 99 })
    local size = d:chance(248) and #m.data or d:count() & 0xffffffff
    local loc = string.pack("<I4I2I2I2I2I2I4I4I4I2I2", 0x04034b50, 20, 0, method, 0, 0, crc, size, #m.data,
      #m.name, 0) .. m.name
    central[#central + 1] = string.pack("<I4I2I2I2I2I2I2I4I4I4I2I2I2I2I2I4I4", 0x02014b50, 20, 20,
      d:chance(250) and 0 or 1, method, 0, 0, crc, size, #m.data, #m.name, 0, 0, 0, 0, 0,
      d:chance(248) and offset or d:count() & 0xffffffff) .. m.name
    locals[#locals + 1] = loc .. m.data
    offset = offset + #loc + #m.data
  end
  local cd = table.concat(central)
  local n = d:chance(248) and #members or d:below(70000) & 0xffff
  return table.concat(locals) .. cd .. string.pack("<I4I2I2I2I2I4I4I2", 0x06054b50, 0, 0, n, n, #cd, offset, 0)
end

local function sae_gemma_scope(d, root)
  local d_in, d_sae = 2 + d:below(4), 2 + d:below(6)
  local members = {}
  for i, a in ipairs({ { "W_enc", { d_in, d_sae } }, { "W_dec", { d_sae, d_in } }, { "b_enc", { d_sae } },
    { "b_dec", { d_in } }, { "threshold", { d_sae } } }) do
    local n = #a[2] == 2 and a[2][1] * a[2][2] or a[2][1]
    members[#members + 1] = { name = (d:chance(248) and a[1] or d:string()) .. ".npy", data = npy_bytes(d, a[2],
      f32(n, i)) }
  end
  if d:chance(8) then members[#members + 1] = { name = "extra.npy", data = npy_bytes(d, { 1 }, f32(1, 9)) } end
  local folder = d:chance(128) and "/layer_" .. d:below(3) or ""
  if folder ~= "" then assert(fs.mkdir(root .. folder)) end
  put("sae" .. folder .. "/params.npz", zip_bytes(d, members))
  return root .. folder
end

-- an SAE in one of the layouts ember reads, written here small and well-formed, then mutated where it
-- has structure (the JSON config, the safetensors headers' shapes, dtypes, names and offsets, the
-- .npy headers and the ZIP records of an .npz) and loaded. The formats carry no digest ember checks
-- (an .npz entry's CRC-32 is not read), so nothing is recomputed. A load must succeed or raise naming
-- the SAE's path; what loads must encode a row into [1, d_sae] and decode it into [1, d_out].
local function fuzz_sae(d)
  local root = dir .. "/sae"
  fs.remove_tree(root)
  assert(fs.mkdir(root))
  local layout = d:pick({ sae_saelens, sae_llama_scope, sae_gemma_scope })
  local path = layout(d, root)
  if not path then return end
  local opts = {}
  if layout == sae_gemma_scope or d:chance(20) then
    opts.hook = d:chance(240) and "blocks.1.hook_resid_post" or d:string()
  end
  if d:chance(30) then opts.dtype = d:pick({ "f32", "f16", "bf16", "f64" }) end
  local ok, sae = pcall(require("ember.sae").load, path, opts)
  expect_named(ok, sae, root, "sae.load")
  if not ok then return end
  local x = core.tensor(1, sae.d_in, (function()
    local v = {}
    for i = 1, sae.d_in do v[i] = i / 4 - 1 end
    return v
  end)())
  local f = sae:encode(x)
  local y = sae:decode(f, x)
  local fs_, ys = f:shape(), y:shape()
  if fs_[1] ~= 1 or fs_[2] ~= sae.d_sae or ys[1] ~= 1 or ys[2] ~= sae.d_out then
    error(string.format("an SAE that loaded encodes to [%d, %d] and decodes to [%d, %d], not [1, %d] and [1, %d]",
      fs_[1], fs_[2], ys[1], ys[2], sae.d_sae, sae.d_out), 0)
  end
  sae:close()
end

local MODES = { fuzz_artifact, fuzz_npy, fuzz_safetensors, fuzz_sweep, fuzz_probe, fuzz_control_vector, fuzz_sae }

return function(data)
  if #data < 1 then return end
  local d = stream(data:sub(2))
  MODES[data:byte(1) % #MODES + 1](d)
end
