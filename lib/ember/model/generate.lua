-- ember.model.generate — model:generate{...}: the generation policy (prompt, prefill, the decode loop,
-- stopping, streaming, the result table) on the C primitives of ember.core: one evaluation call
-- per token (which also draws the next id), the sampler, the experiment runner's lifecycle.
-- Must not touch tensors or the engine's buffers itself; the contract is docs/lua-api.md.

local core = require("ember.core")
local internal = core.internal

local evaluate, logits_of = internal.evaluate, internal.logits
local check_options, opt_int = internal.check_options, internal.opt_int

local M = {}

local OPTIONS = { "ids", "prompt", "bos", "max_tokens", "temperature", "top_k", "top_p", "seed", "experiment",
  "on_token", "context", "eos", "all_logits", "trace", "trace_filter", "session", "sae", "splice" }

-- (level 1: rethrow moves the position to generate's caller)
local function bad(msg) error("bad argument to 'generate' (" .. msg .. ")", 1) end

-- A function, or a value whose metatable (raw, as luaL_getmetafield sees it) has __call.
local function callable(v)
  if type(v) == "function" then return true end
  local mt = debug.getmetatable(v)
  return mt ~= nil and rawget(mt, "__call") ~= nil
end

-- The prompt as token ids: ids= as given, or prompt= through the model's tokenizer (bos= is passed
-- on only when the caller chose). Returns a checked copy, so the caller's table is never kept.
local function prompt_ids(model, opts, n_vocab)
  local ids, prompt = opts.ids, opts.prompt
  if (ids ~= nil) == (prompt ~= nil) then bad("give exactly one of ids= (token ids) or prompt= (text)") end
  if prompt ~= nil then
    if type(prompt) ~= "string" then bad("prompt must be a string, got " .. type(prompt)) end
    local tok = internal.need_tokenizer(model, "generate")
    if opts.bos ~= nil then
      ids = tok:encode(prompt, { bos = opts.bos })
    else
      ids = tok:encode(prompt)
    end
  end
  return internal.check_ids(ids, n_vocab, "generate")
end

-- The stop id: eos= (an id, or false for none), else the tokenizer's eos_id; -1 for none.
local function stop_id(opts, tok)
  local eos = opts.eos
  if type(eos) == "number" then return opt_int(opts, "generate", "eos", -1) end
  if eos == nil then
    local id = tok and tok.eos_id
    return math.type(id) == "integer" and id or -1
  end
  if eos ~= false then bad("eos must be a token id or false, got " .. type(eos)) end
  return -1
end

-- Where the notice of an explicit context beyond the model's goes (callers may replace it).
function M.notice(msg) io.stderr:write("ember: ", msg, "\n") end

-- check_context(info, n_prompt, max_tokens, context, fail, notice): the prompt and the tokens to
-- generate must fit the model's trained context_length unless an explicit context (> 0) was
-- given; one beyond context_length is allowed, with a notice. fail(msg) raises; the messages name
-- both numbers. A model without a context_length (0) is not checked here.
function M.check_context(info, n_prompt, max_tokens, context, fail, notice)
  local limit = info.context_length or 0
  if limit < 1 then return end
  if context > 0 then
    if context > limit and notice then
      notice(string.format("context %d is beyond the model's context_length %d (positions past it were never "
        .. "trained)", context, limit))
    end
    return
  end
  local need = n_prompt + (max_tokens > 0 and max_tokens or 1)
  if need > limit then
    fail(string.format("the prompt (%d tokens) + max_tokens (%d) needs %d positions, more than the model's "
      .. "context_length %d (an explicit context may go beyond it)", n_prompt, max_tokens, need, limit))
  end
end

-- session=: an open ember.Session of this model that the run continues from its position (the
-- caller's, never closed here); the prompt and every token to generate must fit what it has left.
local function continued_session(model, opts, n_prompt, max_tokens)
  local s = opts.session
  local mt = getmetatable(s)
  if type(mt) ~= "table" or mt.__name ~= "ember.Session" then
    bad("session must be an ember.Session, got " .. type(s))
  end
  if s.closed then bad("session: the session is closed") end
  if not rawequal(s.model, model) then bad("session: the session belongs to another model") end
  if opts.context ~= nil then bad("context cannot be given with session= (the session's context is its own)") end
  local need, free = n_prompt + max_tokens, s.context - s.position
  if need > free then
    bad(string.format("the prompt (%d tokens) + max_tokens (%d) needs %d positions, more than the %d the session "
      .. "has left (at position %d of %d)", n_prompt, max_tokens, need, free, s.position, s.context))
  end
  return s
end

-- The checks and set-up of one run, before any hook or evaluation: fills `run` with what it made
-- (sampler, session, runner, ...) so that generate can free it if a later step raises.
local function prepare(run, model, opts, self_arg)
  local info = model.info -- raises "attempt to use a closed model"
  if type(opts) ~= "table" then
    error(string.format("bad argument %s to 'generate' (table expected, got %s)", self_arg,
      opts == nil and "no value" or type(opts)), 1)
  end
  check_options(opts, "generate", OPTIONS)
  local max_tokens = opt_int(opts, "generate", "max_tokens", 16)
  local context = opt_int(opts, "generate", "context", 0)
  if max_tokens < 0 then bad("max_tokens must be >= 0, got " .. max_tokens) end
  if context < 0 then bad("context must be >= 0, got " .. context) end
  local on_token = opts.on_token
  if on_token ~= nil and not callable(on_token) then bad("on_token must be a function, got " .. type(on_token)) end
  run.max_tokens, run.on_token = max_tokens, on_token
  run.all_logits = opts.all_logits and {} or nil
  local n_vocab = info.n_vocab
  -- checks temperature, top_k, top_p and seed, naming generate
  run.sampler = core.sampler({ n_vocab = n_vocab, temperature = opts.temperature, top_k = opts.top_k,
    top_p = opts.top_p, seed = opts.seed }, "generate")

  local ids = prompt_ids(model, opts, n_vocab)
  local tok = model.tokenizer
  run.ids, run.tok, run.eos = ids, tok, stop_id(opts, tok)
  if opts.experiment ~= nil then run.runner = internal.attach(opts.experiment, model, "generate") end
  -- sae=: SAEs spliced into every evaluation (ember.sae.splice; docs/sae.md), on the experiment's
  -- runner or on one of their own
  if opts.sae ~= nil then
    run.saes = require("ember.sae.splice").sites(opts.sae, model, opts.splice, "generate")
    run.runner = run.runner or internal.attach({ name = "sae-splice" }, model, "generate")
    run.runner:set_saes(run.saes.sites)
  elseif opts.splice ~= nil then
    bad("splice needs sae= (the SAEs to splice in)")
  end
  -- the tokenizer's streaming detokenizer, so on_token gets whole UTF-8 characters
  if on_token ~= nil and tok ~= nil and tok.stream ~= nil then run.stream = tok:stream() end
  if opts.session ~= nil then
    run.session, run.continues = continued_session(model, opts, #ids, max_tokens), true
  else
    local n_ctx = context > 0 and context or #ids + (max_tokens > 0 and max_tokens or 1)
    M.check_context(info, #ids, max_tokens, context, function(msg) bad(msg) end, M.notice)
    run.session = internal.session(model, n_ctx, "generate")
    run.owns_session = true
  end
  -- trace=: an ember.Trace (kept open for the caller), or a path (opened here, finished at the end);
  -- else the trace of ember.load{trace=}. Attached to this run's session only.
  local tr = opts.trace
  if tr == nil then tr = require("ember.model.trace").for_model(model) end
  if opts.trace_filter ~= nil and type(tr) ~= "string" then
    bad("trace_filter needs trace = a file path (an ember.Trace keeps the filter it was opened with)")
  end
  if type(tr) == "string" then
    if tr == "" then bad("trace must be an ember.Trace or a file path, got an empty string") end
    local trace = require("ember.model.trace")
    local _, ferr = trace.check_filter(opts.trace_filter, info.n_layers)
    if ferr then bad(ferr) end
    run.trace = trace.open(tr, model, opts.trace_filter)
    run.owns_trace = true
  elseif tr ~= nil and tr ~= false then
    local mt = getmetatable(tr)
    if type(mt) ~= "table" or mt.__name ~= "ember.Trace" then
      bad("trace must be an ember.Trace or a file path, got " .. type(tr))
    end
    if tr.closed then bad("trace: the trace is closed") end
    run.trace = tr
  end
  if run.trace then
    internal.set_trace(run.session, run.trace)
    if run.runner then run.runner:set_tracing(true) end
  end
end

-- Errors of the set-up read as the C function's did: positioned at generate's caller (the message
-- itself names generate), not inside this file. Errors raised elsewhere pass unchanged.
local HERE = debug.getinfo(1, "S").short_src .. ":"
local function rethrow(e)
  if type(e) ~= "string" or e:sub(1, #HERE) ~= HERE then error(e, 0) end
  error((e:gsub("^[^\n]-:%d+: ", "", 1)), 3) -- 1: rethrow, 2: generate, 3: its caller
end

-- Whether an error is the interrupt ember-lua raises on Ctrl-C: "interrupted" itself, or as the
-- message of a hook it interrupted ("experiment 'x' failed in after_mlp (...): interrupted").
local function is_interrupt(e)
  return e == "interrupted"
    or (type(e) == "string" and e:match("^experiment '.*' failed in [%w_]+.*: interrupted$") ~= nil)
end
M.is_interrupt = is_interrupt

-- decode(run, id) -> { ids, decode_ms, decodes, stop }: the decode loop from the id the prefill
-- drew. It runs protected so that Ctrl-C (ember-lua raises "interrupted" in whatever Lua code runs
-- next: this loop, on_token, a hook) keeps the tokens generated so far.
local function decode(run, id)
  local session, sampler, runner, tok, stream = run.session, run.sampler, run.runner, run.tok, run.stream
  local eos, on_token, all_logits, continues = run.eos, run.on_token, run.all_logits, run.continues
  local out_ids, decode_ms, decodes, stop = {}, 0.0, 0, "max_tokens"
  local looped, loop_err = pcall(function()
    for k = 1, run.max_tokens do
      -- Ctrl-C: the flag was seen after the last evaluation; stop between tokens
      if id == false then
        stop = "interrupted"
        break
      end
      if all_logits then all_logits[k] = logits_of(session) end -- the distribution id was drawn from
      out_ids[k] = id
      if on_token ~= nil then
        local piece = nil
        if stream ~= nil then
          piece = stream:push(id)
        elseif tok ~= nil then
          piece = tok:decode({ id })
        end
        if on_token(id, piece) == false then
          stop = "callback"
          break
        end
      end
      -- a continued session keeps only the conversation's tokens: a stopping EOS ends the text
      -- without being evaluated (the caller's next prompt follows the last kept token)
      if continues and id == eos then
        stop = "eos"
        break
      end
      local next_id, ms = evaluate(session, id, runner, sampler, "generate")
      decode_ms = decode_ms + ms
      decodes = decodes + 1
      if id == eos then
        stop = "eos"
        break
      end
      id = next_id
    end
  end)
  if not looped then
    if not is_interrupt(loop_err) then error(loop_err, 0) end
    stop = "interrupted"
  end
  if stop == "interrupted" then internal.clear_interrupt() end
  return { ids = out_ids, decode_ms = decode_ms, decodes = decodes, stop = stop }
end

-- result(run, d, prefill_ms, prompt_logits) -> generate's result table (the trace detached and,
-- when generate opened it, finished).
local function result(run, d, prefill_ms, prompt_logits)
  local session, runner, tok, n_prompt = run.session, run.runner, run.tok, #run.ids
  local out_ids, stop, generated = d.ids, d.stop, #d.ids
  local trace_summary
  if run.trace then
    internal.set_trace(session, nil)
    trace_summary = { fingerprint = run.trace:fingerprint(), events = run.trace.events,
      evaluations = run.trace.evaluations }
    if run.owns_trace then trace_summary = run.trace:finish() end
  end
  local text = nil
  if tok ~= nil then -- the generated ids without a final stop token
    text = tok:decode(table.move(out_ids, 1, generated - (stop == "eos" and 1 or 0), 1, {}))
  end
  return {
    prompt_ids = run.ids,
    ids = out_ids,
    text = text,
    modified = runner ~= nil and runner.modified,
    modified_calls = runner ~= nil and runner.modified_calls or 0,
    stop = stop,
    logits = logits_of(session),
    all_logits = run.all_logits,
    prompt_logits = prompt_logits,
    trace = trace_summary,
    sae = run.saes and require("ember.sae.splice").report(run.saes) or nil,
    stats = {
      prefill_ms = prefill_ms,
      decode_ms = d.decode_ms,
      prefill_tok_s = prefill_ms > 0 and n_prompt * 1e3 / prefill_ms or 0.0,
      decode_tok_s = d.decode_ms > 0 and d.decodes * 1e3 / d.decode_ms or 0.0,
      prompt_tokens = n_prompt,
      generated_tokens = generated,
      decode_count = d.decodes,
    },
  }
end

-- model:generate{ ids= | prompt=, bos=, max_tokens=16, temperature=0, top_k=0, top_p=1, seed=0,
--                 experiment=, on_token=, context=, eos=, all_logits=, trace=, session=, sae=,
--                 splice= } -> out
-- N generated tokens cost one prefill and N decode evaluations: each generated token is fed back
-- once (SPEC §4.1), the last one and a stopping EOS included, so every hook sees every token.
-- The exceptions: a token on which on_token returns false is kept but not evaluated, and with
-- session= a stopping EOS is not evaluated either (the session then holds the prompt and the
-- kept tokens exactly, so a conversation can go on from it).
function M.generate(model, opts)
  -- prompts = {...} or ids = { {...}, ... }: one batch (ember.model.generate_batch)
  local many = type(opts) == "table" and (opts.prompts ~= nil or (type(opts.ids) == "table"
    and type(opts.ids[1]) == "table"))
  if many then
    return require("ember.model.generate_batch").generate(model, opts)
  end
  local run = {}
  local self_arg = debug.getinfo(1, "n").namewhat == "method" and "#1" or "#2"
  local ok, err = pcall(prepare, run, model, opts, self_arg)
  if not ok then
    if run.owns_session then run.session:close() end
    if run.sampler then run.sampler:close() end
    if run.owns_trace then run.trace:close() end
    rethrow(err)
  end
  -- the KV cache (unless it is the caller's) and the sampler are freed when this function returns
  -- or raises
  local session, runner = run.session, run.runner
  local owned_session <close> = run.owns_session and session or nil
  local sampler <close> = run.sampler
  if runner then
    runner:on_model_loaded()
    runner:before_prefill(#run.ids, session.position)
  end
  -- all_logits: the prefill also keeps every prompt position's logits (out.prompt_logits)
  if run.all_logits then internal.set_all_logits(session, true) end
  -- a trace this call opened is finished whether the run succeeds or fails
  local owned_trace <close> = run.owns_trace and setmetatable({}, { __close = function()
    if not run.trace.closed then
      internal.set_trace(session, nil)
      pcall(run.trace.close, run.trace)
    end
  end }) or nil
  local id, prefill_ms = evaluate(session, run.ids, runner, sampler, "generate")
  local prompt_logits
  if run.all_logits then
    prompt_logits = internal.all_logits(session)
    internal.set_all_logits(session, false)
  end
  local d = decode(run, id)
  -- an interrupted run is not a completed one
  if runner and d.stop ~= "interrupted" then runner:on_generation_complete(#run.ids, #d.ids, d.decodes) end
  return result(run, d, prefill_ms, prompt_logits)
end

return M
