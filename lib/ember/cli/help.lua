-- ember.cli.help — the one-line descriptions behind the REPL's help() and help(obj): the functions of
-- the ember module and the methods and properties of each ember class. Must stay complete: the
-- spec (spec/repl_spec.lua) fails for any function or method of the API that has no line here.

local M = {}

-- ember.<name>
M.MODULE = {
  load = "ember.load{ model=, tokenizer=, arch=, kernels=, threads=, trace= } -> Model (or ember.load(path))",
  default_model = "ember.default_model() -> path of the tiny default model (made on first use in the cache "
    .. "directory)",
  load_experiment = "ember.load_experiment(path [, args [, model]]) -> experiment table from a file",
  tensor = "ember.tensor(rows, cols [, values]) -> Tensor (values flat or nested; zeros by default)",
  tensor_from_bytes = "ember.tensor_from_bytes(bytes, rows, cols) -> Tensor from little-endian f32 bytes",
  save_tensors = "ember.save_tensors(path, { name = t, ... } [, metadata]) -> true (safetensors, atomic)",
  load_tensors = "ember.load_tensors(path) -> { name = Tensor }, metadata",
  tokenizer = "ember.tokenizer{ file = 'tokenizer.json' } | { gguf = 'vocab.gguf' } -> Tokenizer",
  tokenizer_build = "ember.tokenizer_build(spec) -> Tokenizer from a parsed tokenizer description "
    .. "(internal to ember.tokenizer)",
  tokenizer_from_gguf = "ember.tokenizer_from_gguf(path) -> Tokenizer from a GGUF's embedded vocabulary",
  make_tiny_model = "ember.make_tiny_model(path [, { family, dtype, seed }]) -> true | nil, message",
  read_control_vector = "ember.read_control_vector(path) -> { n_embd, model_hint, layer_count, "
    .. "directions = { {layer, tensor} } } (llama.cpp control vector)",
  write_control_vector = "ember.write_control_vector(path, { model_hint =, directions = { {layer = N, tensor} } }) "
    .. "-> true: llama.cpp's control-vector layout (ember control-vector makes one)",
  sampler = "ember.sampler{ n_vocab, temperature, top_k, top_p, seed } -> Sampler (what generate samples with)",
  check_experiment = "ember.check_experiment(exp [, fname]) -> { hook = fn }: the attach-time checks of an experiment",
  sha256 = "ember.sha256(s) -> 64 lowercase hex characters",
  read_file = "ember.read_file(path, max_bytes) -> contents | nil, message (regular files only, at most max_bytes)",
  tokenizer_check = "ember.tokenizer_check(tok, model) -> true | false, why: tok against the GGUF's own vocabulary",
  sha256_file = "ember.sha256_file(path) -> hex | nil, message",
  cpu = "ember.cpu() -> { avx2, avx512f, ..., kernels = best kernel set }",
  now = "ember.now() -> wall-clock seconds since the Unix epoch (microseconds), for timing",
  now_ms = "ember.now_ms() -> milliseconds from a monotonic clock (for measuring; the origin means nothing)",
  add = "ember.add(a, b) -> a + b elementwise (a row or a number broadcasts), a new tensor",
  sub = "ember.sub(a, b) -> a - b elementwise, a new tensor",
  mul = "ember.mul(a, b) -> a * b elementwise, a new tensor",
  div = "ember.div(a, b) -> a / b elementwise, a new tensor",
  matmul = "ember.matmul(a, b) -> [r, k] x [k, c] -> [r, c]",
  matmul_t = "ember.matmul_t(a, b) -> a times b transposed: [r, k] x [c, k] -> [r, c]",
  dot = "ember.dot(a, b) -> the sum of a * b over every element",
  cosine = "ember.cosine(a, b) -> the cosine of two tensors of one shape (NaN for all zeros)",
  extract_hidden = "ember.extract_hidden{ model=, prompts={ text | {prompt=, label=} }, layers= } -> per prompt "
    .. "{ ids, hidden = { [layer] = Tensor } } (docs/extraction.md)",
  trace = "ember.trace(path [, model [, { layers=, ops= }]]) -> Trace: a structured trace file for "
    .. "generate{trace=} (docs/inspection.md)",
  fingerprint = "ember.fingerprint(t) -> the value fingerprint of a tensor or view (FNV-1a 64 of its f32 bytes)",
  sae_new = "ember.sae_new(spec [, model]) -> the engine SAE of a parsed file description "
    .. "(internal to ember.sae.load)",
  sae_sites = "ember.sae_sites({ { sae =, stage =, layer =, ... } }) -> the SAEs a run splices in "
    .. "(internal to generate{ sae = })",
  sae_stats = "ember.sae_stats(d_sae) -> Stats: st:add(f [, g]) sums feature activations (and a second set's), "
    .. "st:result() (internal to ember.sae.eval/compare)",
  sweep = "ember.sweep{ model=, clean=, corrupted= | pairs=, metric=, stages=, layers=, positions=, out=, ... } -> "
    .. "a causal sweep's result (docs/sweeps.md)",
  attribute = "ember.attribute{ model=, clean=, corrupted=, metric=, components=, verify=K } -> AtP scores ranked "
    .. "(r.ranked, r.scores, r.verify) (docs/attribution.md)",
  probe = "ember.probe.train{ x = T | { T, ... }, y = { labels }, seed=, control=, ... } -> probe "
    .. "(probe:predict(t) -> labels, probs; probe:save(path, { layer = })); ember.probe.load(path) (docs/probes.md)",
  act_name = "ember.act_name(name [, layer]) -> the TransformerLens hook name: act_name('resid_post', 3) is "
    .. "'blocks.3.hook_resid_post' (ember stage names too)",
  stage_of = "ember.stage_of(name) -> ember stage, layer: stage_of('blocks.3.hook_resid_post') is after_layer, 3",
  plot = "ember.plot.heatmap(t, { out = 'DIR/name', xtokens=, ytokens=, ... }) -> { svg, png }; "
    .. "ember.plot.attention{ model=, prompt=, layer=, heads=, out= } (docs/lua-api.md)",
}

-- methods and properties per class (the metatable's __name)
M.CLASSES = {
  ["ember.Model"] = {
    session = "m:session{ context = N } -> Session (a KV cache)",
    batch = "m:batch{ size = N, context = C } -> Batch: N sequences evaluated together (b:prefill, b:decode)",
    generate = "m:generate{ prompt= | ids=, max_tokens=, experiment=, on_token=, all_logits=, trace=, ... } -> out",
    tokenize = "m:tokenize(text [, { bos=, special= }]) -> { ids } (0-based token ids)",
    detokenize = "m:detokenize(ids) -> text",
    set_tokenizer = "m:set_tokenizer(tok) attaches a tokenizer (nil removes it)",
    close = "m:close() frees the model (sessions keep the engine model alive)",
    sha256 = "m:sha256() -> hex, \"cached\"|\"fresh\": the model file's digest (waits for the background hash)",
    sha256_start = "m:sha256_start(): start hashing the model file in the background (idempotent)",
    unembed = "m:unembed(t) -> [rows, n_vocab]: the final norm and LM head on a residual (the logit lens)",
    weight = "m:weight(name [, rows]) -> [n_out, n_in]: a stored weight, dequantized (e.g. 'blk.3.attn_output'); "
      .. "rows: only those (0-based)",
    tensors = "m:tensors() -> { { name, type, shape, bytes }, ... }: every tensor of the file (shape outermost "
      .. "first)",
    same_tensor = "m:same_tensor(other, name) -> true when both models bind that tensor with the same type, shape "
      .. "and bytes",
    final_norm_frozen = "m:final_norm_frozen(x, ref) -> [rows, hidden]: residual components through the final "
      .. "norm with ref's scale frozen (no bias)",
    to_tokens = "m:to_tokens(text [, { bos= }]) -> { ids } (as m:tokenize)",
    to_str_tokens = "m:to_str_tokens(text | ids) -> { pieces }: each token's text",
    to_single_token = "m:to_single_token(text) -> id; an error unless text is exactly one token",
    run_with_cache = "m:run_with_cache{ ids=|prompt=, stages=, layers=, ... } -> cache: one prefill, activations kept",
    gradients = "m:gradients{ ids=|prompt=, metric=, stages=, freeze=, values= } -> g: d metric / d activations "
      .. "(g:get(stage, layer))",
    info = "m.info: family, n_layers, hidden_size, n_vocab, kernels, threads, ...",
    tokenizer = "m.tokenizer: the Tokenizer, or nil",
    closed = "m.closed: true after close()",
    trace = "m.trace: the Trace of ember.load{ trace= }, or nil",
  },
  ["ember.ActivationCache"] = {
    get = "c:get(stage [, layer]) -> Tensor (ember or TransformerLens names; c['blocks.3.hook_resid_post'] too)",
    keys = "c:keys() -> the TransformerLens names of the cached tensors, in execution order",
    stack = "c:stack(stage) -> [n * rows, width], layers: the stage's tensors of every cached layer, one block each",
    accumulated_resid = "c:accumulated_resid([layer]) -> stack, labels: the residual entering layers 0 .. layer",
    decompose_resid = "c:decompose_resid([layer]) -> stack, labels: embedding, each attention and MLP output",
    stack_head_results = "c:stack_head_results([layer]) -> stack, labels: each head through its slice of W_O",
    apply_ln_to_stack = "c:apply_ln_to_stack(stack [, pos]) -> the final norm with the final residual's scale frozen",
    logit_attrs = "c:logit_attrs(t, tokens [, incorrect]) -> [k, #tokens]: direct logit attribution",
    layers = "c:layers() iterates l, { stage = Tensor } over the cached layers from 0; c.layers lists them",
  },
  ["ember.sae.SAE"] = {
    encode = "sae:encode(t) -> [rows, d_sae]: the feature activations of [rows, d_in] activations (in C)",
    decode = "sae:decode(f [, x]) -> [rows, d_out]: the reconstruction (x: the inputs, for row-wise norms)",
    direction = "sae:direction(i) -> [1, d_out]: feature i's decoder row (0-based)",
    close = "sae:close() frees the SAE's weights",
  },
  ["ember.Trace"] = {
    fingerprint = "tr:fingerprint() -> the normalized trace fingerprint so far (16 hex digits)",
    finish = "tr:finish() -> { events, evaluations, fingerprint }: writes the summary line and closes",
    close = "tr:close() closes the file without a summary line",
    events = "tr.events: lines the engine wrote",
    evaluations = "tr.evaluations: evaluations traced",
    closed = "tr.closed: true once finished or closed",
  },
  ["ember.Session"] = {
    prefill = "s:prefill(ids [, { experiment=, all_logits= }]) -> logits [1, n_vocab] "
      .. "([#ids, n_vocab] with all_logits)",
    decode = "s:decode(id [, { experiment= }]) -> logits [1, n_vocab]",
    logits = "s:logits() -> the current logits (a copy), or nil",
    reset = "s:reset() empties the cache (position 0)",
    rewind = "s:rewind(p) back to position p, keeping the cache of positions 0..p-1",
    close = "s:close() frees the cache",
    position = "s.position: tokens in the cache",
    context = "s.context: the cache's size",
    model = "s.model: the Model",
    closed = "s.closed: true after close()",
  },
  ["ember.Tensor"] = {
    shape = "t:shape() -> { rows, cols }",
    dtype = "t:dtype() -> 'f32'",
    get = "t:get(r, c) -> value (1-based)",
    set = "t:set(r, c, v) (1-based)",
    row = "t:row(r) -> [1, cols] (a sub-view of a view, a copy of a tensor)",
    values = "t:values() -> Lua array, row-major",
    bytes = "t:bytes() -> raw little-endian f32 bytes",
    write_bytes = "t:write_bytes(file) -> true | nil, reason: t:bytes() written to an open file, no string made",
    l2_norm = "t:l2_norm() -> sqrt(sum x^2)",
    abs_max = "t:abs_max() -> max |x|",
    fingerprint = "t:fingerprint() -> FNV-1a 64 of the bytes",
    sha256 = "t:sha256() -> hex SHA-256 of the bytes",
    argmax = "t:argmax([r]) -> 1-based column of the largest value",
    top1 = "t:top1() -> per row, the 0-based column of the largest value (token ids for logits)",
    compare = "t:compare(u) -> { bitwise_equal, max_abs_diff, cosine, rel_l2, ... }",
    clone = "t:clone() -> an owned copy",
    zero = "t:zero() in place",
    scale = "t:scale(k) in place",
    add = "t:add(x [, k]) in place t += k*x (x: number, same shape, or one row for every row)",
    copy_from = "t:copy_from(src) in place, same shape",
    token_argmax = "t:token_argmax([row]) -> the 0-based token id greedy decoding picks from that row",
    topk = "t:topk(k [, row]) -> ids (0-based), values: the k largest of the row, best first",
    softmax = "t:softmax() -> per row, a new tensor",
    log_softmax = "t:log_softmax() -> per row, a new tensor",
    matmul = "a:matmul(b) -> [r, k] x [k, c] -> [r, c]",
    matmul_t = "a:matmul_t(b) -> a times b transposed ([c, k] weights as stored)",
    transpose = "t:transpose() -> [cols, rows]",
    dot = "a:dot(b) -> the sum of a * b over every element",
    cosine = "a:cosine(b) -> the cosine of two tensors of one shape",
    sum = "t:sum() -> [1, cols]: the sum over the rows",
    mean = "t:mean() -> [1, cols]: the mean over the rows",
    slice = "t:slice(r0 [, r1]) -> rows r0..r1 (1-based, inclusive)",
    head = "t:head(h [, n_heads [, layout]]) -> head h (0-based) of a per-head tensor",
  },
  ["ember.Batch"] = {
    prefill = "b:prefill({ ids1, ids2, ... } [, { experiment=, all_logits=, sequences= }]) -> { logits1, ... }",
    decode = "b:decode({ id1, id2, ... } [, { experiment=, sequences= }]) -> { logits1, ... }",
    position = "b:position(i) -> sequence i's position",
    logits = "b:logits(i) -> sequence i's current logits, or nil",
    reset = "b:reset([i]): sequence i (or all) back to position 0",
    rewind = "b:rewind(i, p): sequence i back to position p, keeping its cache of 0..p-1",
    close = "b:close() frees the batch's KV caches",
    size = "b.size: the number of sequences",
    context = "b.context: each sequence's positions",
    closed = "b.closed",
  },
  ["ember.Context"] = {
    token_position = "ctx:token_position() -> the position of a one-token evaluation, else nil",
  },
  ["ember.Sampler"] = {
    sample = "smp:sample(logits) -> token id",
    close = "smp:close()",
    n_vocab = "smp.n_vocab",
    closed = "smp.closed",
  },
  ["ember.Tokenizer"] = {
    encode = "tok:encode(text [, { bos=, special= }]) -> { ids }",
    decode = "tok:decode(ids) -> text",
    token = "tok:token(id) -> the token's text",
    find = "tok:find(vocab_string) -> the id whose vocabulary string it is, or nil",
    is_special = "tok:is_special(id) -> bool",
    stream = "tok:stream([opts]) -> a streaming detokenizer (push(id) -> text)",
    close = "tok:close()",
    vocab_size = "tok.vocab_size",
    bos_id = "tok.bos_id",
    eos_id = "tok.eos_id",
    adds_bos = "tok.adds_bos: whether encode adds BOS by default",
  },
}
-- a view has a tensor's methods, and two more
M.CLASSES["ember.TensorView"] = setmetatable({
  expired = "v:expired() -> true once the hook call that received it has returned",
  sequence = "v:sequence(i) -> the rows of sequence i of the evaluation (a writable sub-view; ctx.sequences)",
}, { __index = M.CLASSES["ember.Tensor"] })

-- members(obj) -> sorted names of obj's methods and properties (what its metatable lists).
function M.members(obj)
  local mt = getmetatable(obj)
  local names, seen = {}, {}
  if type(mt) ~= "table" then return names end
  for _, list in ipairs({ "__methods", "__getters" }) do
    for k in pairs(rawget(mt, list) or {}) do
      if not seen[k] then seen[k] = true; names[#names + 1] = k end
    end
  end
  if type(rawget(mt, "__index")) == "table" then
    for k in pairs(rawget(mt, "__index")) do
      if type(k) == "string" and not seen[k] then seen[k] = true; names[#names + 1] = k end
    end
  end
  table.sort(names)
  return names
end

local function class_name(obj)
  local mt = getmetatable(obj)
  return type(mt) == "table" and rawget(mt, "__name") or nil
end

-- tensor_lines(model) -> the model's tensors for help(m): those outside the blocks, and block 0's
-- as the pattern of every block (m:tensors() lists each one).
function M.tensor_lines(model)
  local list = model:tensors()
  local out = { string.format("tensors (m:tensors(): %d; name, type, shape outermost first):", #list) }
  local blocks = 0
  for _, d in ipairs(list) do
    local b, rest = d.name:match("^blk%.(%d+)%.(.+)$")
    if b then blocks = math.max(blocks, tonumber(b) + 1) end
    if not b or b == "0" then
      local name = b and ("blk.N." .. rest) or d.name
      out[#out + 1] = string.format("  %-36s %-6s [%s]", name, d.type, table.concat(d.shape, ", "))
    end
  end
  if blocks > 0 then
    out[#out + 1] = string.format("  (blk.N: block 0's shown; the model has blocks 0-%d)", blocks - 1)
  end
  return out
end

-- text([obj]) -> the help text: without obj the ember module; for an ember object its class's
-- methods; for a function of the module its line.
function M.text(obj)
  local ember = require("ember")
  local lines = {}
  if obj == nil or obj == ember then
    lines[1] = "ember " .. ember.version .. ": the functions of the ember module (help(obj) for an object's methods)"
    local names = {}
    for k, v in pairs(ember) do if type(v) == "function" then names[#names + 1] = k end end
    table.sort(names)
    for _, k in ipairs(names) do lines[#lines + 1] = "  " .. (M.MODULE[k] or ("ember." .. k)) end
    lines[#lines + 1] = "tables: ember.selectors (flag parsers), ember.stages, ember.hooks, ember.LOAD_OPTIONS"
    return table.concat(lines, "\n") .. "\n"
  end
  if type(obj) == "function" then
    for k, v in pairs(ember) do
      if v == obj then return (M.MODULE[k] or ("ember." .. k)) .. "\n" end
    end
    return "a function (not one of the ember module's)\n"
  end
  local cname = class_name(obj)
  local descr = cname and M.CLASSES[cname]
  if not descr then return "a " .. type(obj) .. " (help() lists the ember module)\n" end
  lines[1] = cname .. ":"
  for _, k in ipairs(M.members(obj)) do lines[#lines + 1] = "  " .. (descr[k] or k) end
  if cname == "ember.Model" and not obj.closed then
    for _, l in ipairs(M.tensor_lines(obj)) do lines[#lines + 1] = l end
  end
  return table.concat(lines, "\n") .. "\n"
end

return M
