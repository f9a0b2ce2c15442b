-- ember.sae.top — the top-activating examples of SAE features over a prompt set: for each chosen
-- feature the N prompts where it fires most (its largest activation in the prompt, at which
-- position), with the tokens around that position and the feature's activation on each of them;
-- resumable and shardable like a sweep (prompts are the units: sweep.in_shard splits them, a rerun
-- keeps the prompts done, merge joins shards), stored as JSON + safetensors (docs/sae.md). Must not
-- parse flags or draw (cli/sae.lua, sae/card.lua).

local core = require("ember.core")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local safetensors = require("ember.store.safetensors")
local sweep = require("ember.sweep")
local token_label = require("ember.analysis.token_label")

local M = {}

M.FORMAT = "ember-sae-top"
M.VERSION = 1
M.JSON = "top.json"
M.TENSORS = "top.safetensors"
-- The largest top.json read (fs.read's bound): a feature's examples, each with its context.
M.MAX_JSON_BYTES = 1 << 30

local function fail(msg, ...) error("sae top: " .. string.format(msg, ...), 0) end

local function sha256(s) return core.sha256(s) end

-- Examples rank by activation (larger first), then prompt, then position (lower first): one order,
-- so shards merge into exactly the unsharded result.
local function before(a, b)
  if a.activation ~= b.activation then return a.activation > b.activation end
  if a.prompt ~= b.prompt then return a.prompt < b.prompt end
  return a.position < b.position
end

-- Keeps list sorted and at most n long with ex added (if it ranks).
local function offer(list, ex, n)
  if #list == n and not before(ex, list[n]) then return end
  local i = #list + 1
  while i > 1 and before(ex, list[i - 1]) do i = i - 1 end
  table.insert(list, i, ex)
  if #list > n then list[#list] = nil end
end
M.offer = offer

-- The settings that decide the result; a resumed or merged directory must have the same.
local function settings(o)
  return json.ordered({ "model", "sae", "hook", "d_sae", "features", "top", "before", "after", "prompts" }, {
    model = o.model_sha256 or json.null, sae = o.sae_sha256 or json.null, hook = o.sae.hook, d_sae = o.sae.d_sae,
    features = json.array({ table.unpack(o.features) }), top = o.top, before = o.before, after = o.after,
    prompts = json.ordered({ "count", "sha256" }, { count = #o.prompts, sha256 = o.prompts_sha256 or json.null }),
  })
end

-- The features of one prompt's prefill (the SAE spliced in unedited: the run is the plain one).
local function features_of(model, sae, ids)
  local grab = { name = "sae-top" }
  function grab:sae_features(ctx, f) if ctx.phase == "prefill" then self.f = f:clone() end end
  model:generate { ids = ids, max_tokens = 0, sae = sae, experiment = grab }
  return grab.f
end

-- Adds prompt p's examples: for each feature its largest activation (first position on ties) and
-- the window of activations and tokens around it.
local function add_prompt(state, o, p_index, ids, f)
  local T = f:transpose() -- [d_sae, n]
  local n = #ids
  for k, feat in ipairs(o.features) do
    local col = T:argmax(feat + 1)
    local act = T:get(feat + 1, col)
    if act > 0 then
      local pos = col - 1
      local ex = { prompt = p_index, position = pos, activation = act }
      local list = state.lists[k]
      if #list < o.top or before(ex, list[#list]) then
        local first, last = math.max(0, pos - o.before), math.min(n - 1, pos + o.after)
        ex.first, ex.ids, ex.activations = first, {}, {}
        for q = first, last do
          ex.ids[#ex.ids + 1] = ids[q + 1]
          ex.activations[#ex.activations + 1] = T:get(feat + 1, q + 1)
        end
        offer(list, ex, o.top)
      end
    end
  end
end

-- ---- the store ------------------------------------------------------------------------------------

local EX_KEYS = { "prompt", "position", "activation", "first", "ids", "tokens", "activations" }

local function doc_of(state, o, status)
  local feats = json.array()
  for k, feat in ipairs(o.features) do
    local exs = json.array()
    for i, ex in ipairs(state.lists[k]) do
      exs[i] = json.ordered(EX_KEYS, { prompt = ex.prompt, position = ex.position, activation = ex.activation,
        first = ex.first, ids = json.array({ table.unpack(ex.ids) }), tokens = json.array(ex.tokens or {}),
        activations = json.array({ table.unpack(ex.activations) }) })
    end
    feats[k] = json.ordered({ "feature", "fired", "max", "examples" }, { feature = feat,
      fired = state.fired[k], max = state.max[k] > -math.huge and state.max[k] or json.null, examples = exs })
  end
  local done = {}
  for i in pairs(state.done) do done[#done + 1] = i end
  table.sort(done)
  return json.ordered({ "format", "version", "status", "settings", "settings_sha256", "shard", "tokens",
    "prompts_done", "features" }, {
    format = M.FORMAT, version = M.VERSION, status = status, settings = state.settings,
    settings_sha256 = state.settings_sha256,
    shard = state.shard and json.ordered({ "index", "count" }, state.shard) or json.null, tokens = state.tokens,
    prompts_done = json.array(done), features = feats,
  })
end

-- The tensors beside the JSON: values/prompt/position [n_features, top] (NaN where a feature has
-- fewer examples) and windows [n_features * top, before + 1 + after] (NaN outside the prompt).
local function tensors_of(state, o)
  local nf, w = #o.features, o.before + 1 + o.after
  local nan = 0 / 0
  local vals, prom, posn, wins = {}, {}, {}, {}
  for k = 1, nf do
    local list = state.lists[k]
    for i = 1, o.top do
      local ex = list[i]
      vals[#vals + 1] = ex and ex.activation or nan
      prom[#prom + 1] = ex and ex.prompt or nan
      posn[#posn + 1] = ex and ex.position or nan
      for c = 0, w - 1 do
        local q = ex and (ex.position - o.before + c) or nil
        local idx = ex and q - ex.first + 1
        wins[#wins + 1] = ex and idx >= 1 and ex.activations[idx] or nan
      end
    end
  end
  local function f32(v) return string.pack("<" .. string.rep("f", #v), table.unpack(v)) end
  return safetensors.encode({
    { name = "values", shape = { nf, o.top }, data = f32(vals) },
    { name = "prompt", shape = { nf, o.top }, data = f32(prom) },
    { name = "position", shape = { nf, o.top }, data = f32(posn) },
    { name = "windows", shape = { nf * o.top, w }, data = f32(wins) },
  }, { format = M.FORMAT, settings_sha256 = state.settings_sha256 })
end

-- write(dir, state, o, status): the tensors first, then the JSON that names them (atomically each).
function M.write(dir, state, o, status)
  local ok, err = fs.mkdir_p(dir)
  if not ok then fail("%s", err) end
  fs.write_atomic(fs.join(dir, M.TENSORS), tensors_of(state, o), "sae top")
  fs.write_atomic(fs.join(dir, M.JSON), json.encode(doc_of(state, o, status), { indent = "  " }), "sae top")
end

-- read(dir) -> the JSON document, or nil when the directory holds none.
function M.read(dir)
  local path = fs.join(dir, M.JSON)
  if not fs.exists(path) then return nil end
  local doc = json.decode(fs.read(path, "sae top", M.MAX_JSON_BYTES), path)
  if type(doc) ~= "table" or doc.format ~= M.FORMAT then fail("%s is not an ember sae top result", path) end
  if doc.version ~= M.VERSION then
    fail("%s has version %s, this ember reads %d", path, tostring(doc.version), M.VERSION)
  end
  return doc
end

-- The state held in a document (resumed or merged).
local function state_of(doc, n_features)
  local st = { lists = {}, fired = {}, max = {}, done = {}, tokens = doc.tokens or 0 }
  for k = 1, n_features do
    local f = doc.features[k]
    st.fired[k], st.max[k] = f.fired, f.max == json.null and -math.huge or f.max
    st.lists[k] = {}
    for i, ex in ipairs(f.examples) do
      st.lists[k][i] = { prompt = ex.prompt, position = ex.position, activation = ex.activation, first = ex.first,
        ids = ex.ids, tokens = ex.tokens, activations = ex.activations }
    end
  end
  for _, i in ipairs(doc.prompts_done) do st.done[i] = true end
  return st
end

-- ---- running ----------------------------------------------------------------------------------------

local function fresh_state(n)
  local st = { lists = {}, fired = {}, max = {}, done = {}, tokens = 0 }
  for k = 1, n do st.lists[k], st.fired[k], st.max[k] = {}, 0, -math.huge end
  return st
end

-- The options' defaults and checks: top/before/after, the features (default: every feature, each
-- one of the SAE's), the shard.
local function check_options(o)
  o.top, o.before, o.after = o.top or 10, o.before or 8, o.after or 4
  if o.features == nil then
    o.features = {}
    for i = 0, o.sae.d_sae - 1 do o.features[#o.features + 1] = i end
  end
  for _, f in ipairs(o.features) do
    if math.type(f) ~= "integer" or f < 0 or f >= o.sae.d_sae then
      fail("feature %s is not one of the SAE's (0-%d)", tostring(f), o.sae.d_sae - 1)
    end
  end
  if o.shard == nil then return nil end
  local shard, err = sweep.parse_shard(o.shard)
  if not shard then fail("shard: %s", err) end
  return shard
end

-- The state to start from: fresh, or what o.out holds of the same run (another run is refused).
local function start_state(o, shard)
  local st = fresh_state(#o.features)
  st.settings = settings(o)
  st.settings_sha256 = sha256(json.encode(st.settings))
  st.shard = shard
  local prev = o.out and M.read(o.out)
  if not prev then return st end
  if prev.settings_sha256 ~= st.settings_sha256 then
    fail("%s holds a different run (its settings: %s); choose another --out", o.out, json.encode(prev.settings))
  end
  local keep = st.settings
  st = state_of(prev, #o.features)
  st.settings, st.settings_sha256, st.shard = keep, sha256(json.encode(keep)), shard
  return st
end

-- Prompt i (0-based) run and counted into st: the features' firing counts and maxima, its examples.
local function run_prompt(st, o, i)
  local ids = o.prompts[i + 1].ids
  local f = features_of(o.model, o.sae, ids)
  local stats = core.sae_stats(o.sae.d_sae)
  stats:add(f)
  local r = stats:result()
  for k, feat in ipairs(o.features) do
    st.fired[k] = st.fired[k] + r.count[feat + 1]
    if r.max[feat + 1] > st.max[k] then st.max[k] = r.max[feat + 1] end
  end
  add_prompt(st, o, i, ids, f)
  st.tokens = st.tokens + #ids
  st.done[i] = true
end

-- The token pieces of every kept example (once, at the end: evicted ones never need them).
local function label_tokens(st, model)
  for _, list in ipairs(st.lists) do
    for _, ex in ipairs(list) do
      if not ex.tokens then
        ex.tokens = {}
        for j, id in ipairs(ex.ids) do ex.tokens[j] = token_label.printable(model:detokenize({ id })) end
      end
    end
  end
end

-- run{ model, sae, prompts = { { ids, text } }, features = { 0-based ids } (default: every
--   feature), top = 10, before = 8, after = 4, shard = "I/N", out = DIR (resumed when it holds part
--   of the same run), progress = reporter, checkpoint_seconds = 2, model_sha256, sae_sha256,
--   prompts_sha256 } -> { features = { { feature, fired, max, examples } }, status, stats }
function M.run(o)
  local shard = check_options(o)
  local st = start_state(o, shard)
  local mine, resumed = {}, 0
  for i = 0, #o.prompts - 1 do
    if sweep.in_shard(i, shard) then
      mine[#mine + 1] = i
      if st.done[i] then resumed = resumed + 1 end
    end
  end
  if o.progress then o.progress:start(#mine, resumed) end
  local store_now = require("ember.sweep.store").now
  local last, every = store_now(), o.checkpoint_seconds or 2
  local ok, err = pcall(function()
    for _, i in ipairs(mine) do
      if not st.done[i] then
        run_prompt(st, o, i)
        if o.progress then o.progress:step() end
        if o.out and store_now() - last >= every then M.write(o.out, st, o, "partial"); last = store_now() end
      end
    end
  end)
  label_tokens(st, o.model)
  local final = "complete"
  for _, i in ipairs(mine) do if not st.done[i] then final = "partial" end end
  if o.out then M.write(o.out, st, o, final) end
  if o.progress then o.progress:finish(ok) end
  if not ok then error(err, 0) end
  local out = {}
  for k, feat in ipairs(o.features) do
    out[k] = { feature = feat, fired = st.fired[k], max = st.max[k], examples = st.lists[k] }
  end
  return { features = out, status = final, tokens = st.tokens,
    stats = { total = #mine, resumed = resumed, computed = #mine - resumed } }
end

-- merge(out, dirs) -> the merged document: the shards of one run (same settings), their prompts
-- disjoint, joined into out (complete when they cover every prompt).
function M.merge(out, dirs)
  if #dirs == 0 then fail("merge needs at least one shard directory") end
  local docs = {}
  for i, d in ipairs(dirs) do
    docs[i] = M.read(d)
    if not docs[i] then fail("%s holds no %s", d, M.JSON) end
    if docs[i].settings_sha256 ~= docs[1].settings_sha256 then
      fail("%s is another run than %s (settings differ)", d, dirs[1])
    end
  end
  local s = docs[1].settings
  local o = { features = s.features, top = s.top, before = s.before, after = s.after }
  local st = fresh_state(#o.features)
  st.settings, st.settings_sha256 = s, docs[1].settings_sha256
  for i, doc in ipairs(docs) do
    local part = state_of(doc, #o.features)
    for p in pairs(part.done) do
      if st.done[p] then fail("prompt %d is in two shards (%s)", p, dirs[i]) end
      st.done[p] = true
    end
    st.tokens = st.tokens + part.tokens
    for k = 1, #o.features do
      st.fired[k] = st.fired[k] + part.fired[k]
      if part.max[k] > st.max[k] then st.max[k] = part.max[k] end
      for _, ex in ipairs(part.lists[k]) do offer(st.lists[k], ex, o.top) end
    end
  end
  local n = 0
  for _ in pairs(st.done) do n = n + 1 end
  local status = n == s.prompts.count and "complete" or "partial"
  M.write(out, st, o, status)
  return M.read(out)
end

return M
