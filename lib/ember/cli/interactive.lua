-- ember.cli.interactive — `ember interactive`: a chat-style loop over one model. Each line is appended
-- to the conversation and the model continues it, streamed token by token; /reset, /stats, /help.
-- Must not exit on Ctrl-C: during a generation it stops that generation (ember-lua's interrupt),
-- at the prompt it abandons the line (readline through ember.readline, as the REPL does).
--
-- The conversation is a list of token ids (line, continuation, line, ...; each line tokenized once,
-- so a continuation that is not valid text is kept as the ids it is) held by one engine session:
-- each turn prefills only what the session has not evaluated yet (the new line, and a last token
-- a Ctrl-C left unevaluated), then generate continues it (generate{session=}). The models ember
-- runs are base models without a chat template, so nothing is invented around the text.

local flags = require("ember.cli.flags")

local M = {}

M.PROMPT = "> "
M.DEFAULT_MAX_TOKENS = 64

M.FLAGS = {
  flags.option("model", flags.DEFAULT_MODEL_HELP),
  flags.option("tokenizer"),
  { "max-tokens", flags.uint_in(1, flags.MAX_CONTEXT), "N", "tokens generated per turn at most (default 64)" },
  flags.option("temperature"),
  flags.option("top-k"),
  flags.option("top-p"),
  { "seed", "uint", "N", "sampling seed (default 0; turn n uses seed + n - 1)" },
  flags.option("context", "positions the conversation may fill (default: the model's context_length; N may go "
    .. "beyond it)"),
  flags.option("kernels"),
  flags.option("threads"),
  flags.option("help"),
}

M.COMMANDS = {
  { "/help", "this list" },
  { "/reset", "forget the conversation (the next line starts a new one)" },
  { "/stats", "token counts and speeds of the last turn and of the conversation" },
  { "/quit", "leave (Ctrl-D too)" },
}

function M.usage()
  local tail = { "", "In the loop: Ctrl-C stops a generation (the loop goes on), Ctrl-D or /quit leaves." }
  for _, c in ipairs(M.COMMANDS) do tail[#tail + 1] = string.format("  %-8s %s", c[1], c[2]) end
  tail[#tail + 1] = "Experiments are refused. The conversation is plain text in one session: each turn prefills"
  tail[#tail + 1] = "only its new tokens."
  return flags.usage({ "usage: ember interactive [options]", "", "options:" }, M.FLAGS, tail)
end

-- Whether an error is ember-lua's Ctrl-C interrupt (raised in whatever Lua code ran next).
local function is_interrupt(e)
  return e == "interrupted" or (type(e) == "string" and e:match(": interrupted$") ~= nil)
end

-- lines_rl(file) -> an rl table reading plain lines (no terminal: stock Lua, or piped input).
function M.lines_rl(file, out)
  return {
    readline = function(prompt)
      out:write(prompt)
      if out.flush then out:flush() end
      return file:read("l")
    end,
    add_history = function() end,
  }
end

-- The smallest session made without --context (positions; a few MiB of KV cache for the models
-- ember runs), so that short chats never need a larger one.
M.MIN_SESSION = 512

-- The session's size for a conversation that needs `need` positions: --context when given (as
-- each turn's generate had it), else twice what is needed now (at least MIN_SESSION), so that a
-- long chat is refilled into a larger session only each time it doubles; never beyond the limit
-- (0: none), which the turn's check has already compared with `need`.
local function session_size(need, context, limit)
  if context then return context end
  local size = math.max(2 * need, M.MIN_SESSION)
  if limit > 0 and size > limit then size = limit end
  return size
end

-- A conversation's state: c = { model, tok, w (stdout), gen, limit, max_tokens, conversation (token
-- ids), session, last (the last turn's figures), total }. The session holds conversation[1 ..
-- session.position] (a prefix: a Ctrl-C can leave the last sampled token unevaluated); it is made on
-- the first turn and replaced by a larger one when it is full.
local function say(c, fmt, ...) c.w:write(string.format(fmt, ...), "\n") end

local function stats(c)
  local last, total = c.last, c.total
  if not last then say(c, "no turn yet"); return end
  say(c, "last turn: %d new prompt tokens (%d in context), %d generated (stop: %s); prefill %.1f tok/s, "
    .. "decode %.1f tok/s", last.prompt_tokens, last.context_tokens, last.generated, last.stop,
    last.prefill_tok_s, last.decode_tok_s)
  say(c, "conversation: %d tokens of context %s; %d turns, %d tokens generated, %d stopped with Ctrl-C",
    #c.conversation, c.limit > 0 and tostring(c.limit) or "unlimited", total.turns, total.generated,
    total.interrupted)
end

-- session_for(c, need) -> a session with room for `need` positions, holding a prefix of the conversation.
local function session_for(c, need)
  local session = c.session
  -- an error or a Ctrl-C between the prefill and the decode loop leaves the session past the
  -- conversation (the turn was not kept): start it again, the conversation is refilled
  if session and session.position > #c.conversation then session:reset() end
  if session and session.context >= need then return session end
  if session then session:close(); c.session = nil end -- its memory first: the new one is larger
  local size = session_size(need, c.gen.context, c.limit)
  local ok, s = pcall(c.model.session, c.model, { context = size })
  if not ok and size > need then ok, s = pcall(c.model.session, c.model, { context = need }) end
  if not ok then error(s, 0) end
  c.session = s
  return s
end

-- keep(c, add, out, n, new): the turn's line and continuation appended to the conversation (before
-- anything more is printed: a Ctrl-C from here on loses nothing), and its figures counted
local function keep(c, add, out, n, new)
  local conversation, total = c.conversation, c.total
  local kept = #out.ids - (out.stop == "eos" and 1 or 0)
  table.move(add, 1, #add, #conversation + 1, conversation)
  table.move(out.ids, 1, kept, #conversation + 1, conversation)
  local st = out.stats
  c.last = { prompt_tokens = st.prompt_tokens, context_tokens = n, generated = st.generated_tokens, stop = out.stop,
    prefill_tok_s = st.prefill_tok_s, decode_tok_s = st.decode_tok_s }
  total.turns = total.turns + 1
  total.generated = total.generated + st.generated_tokens
  total.prefilled = total.prefilled + st.prompt_tokens
  total.prefill_ms = total.prefill_ms + st.prefill_ms
  total.decode_ms = total.decode_ms + st.decode_ms
  if out.stop == "interrupted" then total.interrupted = total.interrupted + 1 end
  if c.gen.on_turn then
    c.gen.on_turn({ new_ids = new, context_tokens = n, ids = out.ids, text = out.text, stop = out.stop })
  end
end

local function turn(c, line)
  local tok, w, gen, max_tokens = c.tok, c.w, c.gen, c.max_tokens
  -- the first line gets what the tokenizer adds by default (BOS); later ones follow the last
  -- continuation on a new line
  local add = #c.conversation == 0 and tok:encode(line .. "\n") or tok:encode("\n" .. line .. "\n", { bos = false })
  local n = #c.conversation + #add
  if c.limit > 0 and n + max_tokens > c.limit then
    say(c, "the conversation needs %d + %d positions, more than the context (%d positions): /reset to start over",
      n, max_tokens, c.limit)
    return
  end
  local s = session_for(c, n + max_tokens)
  -- what the session has not evaluated yet: the new line, after any conversation tokens past it
  local new = table.move(c.conversation, s.position + 1, #c.conversation, 1, {})
  table.move(add, 1, #add, #new + 1, new)
  local stream = tok:stream { exact = true }
  local eos, printed = tok.eos_id, 0
  local out = c.model:generate { session = s, ids = new, max_tokens = max_tokens,
    temperature = gen.temperature or 0.0, top_k = gen.top_k or 0, top_p = gen.top_p or 1.0,
    seed = (gen.seed or 0) + c.total.turns,
    on_token = function(id)
      if id == eos then return end
      local chunk = stream:push(id)
      if #chunk > 0 then
        w:write(chunk)
        if w.flush then w:flush() end
        printed = printed + #chunk
      end
    end }
  keep(c, add, out, n, new)
  local text = out.text or ""
  w:write(text:sub(printed + 1)) -- what the stream still held (an unfinished character)
  if out.stop == "interrupted" then w:write(" [stopped]") end
  w:write("\n")
end

-- step(c, rl) -> true when the conversation is over: one line read and answered
local function step(c, rl)
  local line = rl.readline(M.PROMPT)
  if line == nil then c.w:write("\n"); return true end
  if line == false or line:match("^%s*$") then return false end
  rl.add_history(line)
  local cmd = line:match("^%s*(/%S+)%s*$")
  if cmd == "/quit" or cmd == "/exit" then
    return true
  elseif cmd == "/help" then
    for _, k in ipairs(M.COMMANDS) do say(c, "  %-8s %s", k[1], k[2]) end
    say(c, "  Ctrl-C   stop the generation running (the conversation keeps what was generated)")
  elseif cmd == "/reset" then
    c.conversation, c.last = {}, nil
    if c.session then c.session:reset() end -- the same KV cache, from position 0
    say(c, "conversation reset")
  elseif cmd == "/stats" then
    stats(c)
  elseif cmd then
    say(c, "unknown command %s (/help lists them)", cmd)
  else
    turn(c, line)
  end
  return false
end

-- run(model, rl, io_, gen) -> the conversation's totals. rl: { readline(prompt) -> line | nil (end)
-- | false (Ctrl-C at the prompt), add_history(line) }; io_: { stdout, stderr }; gen: { max_tokens,
-- temperature, top_k, top_p, seed, context, on_turn }. on_turn(t), if given, is called after each
-- turn with t = { new_ids (the ids prefilled), context_tokens, ids (generated), text, stop }.
function M.run(model, rl, io_, gen)
  local info = model.info
  local c = { model = model, tok = model.tokenizer, w = io_.stdout, gen = gen,
    limit = gen.context or info.context_length or 0, max_tokens = gen.max_tokens or M.DEFAULT_MAX_TOKENS,
    conversation = {}, session = nil, last = nil,
    total = { turns = 0, generated = 0, interrupted = 0, prefilled = 0, decode_ms = 0.0, prefill_ms = 0.0 } }
  say(c, "ember interactive: %s (%s, %d layers). /help lists commands; Ctrl-C stops a generation, Ctrl-D exits.",
    info.path, info.family, info.n_layers)
  -- a --context beyond the model's context_length is said once (generate does not check a
  -- session it continues)
  if gen.context and (info.context_length or 0) > 0 and gen.context > info.context_length then
    require("ember.model.generate").notice(string.format("context %d is beyond the model's context_length %d "
      .. "(positions past it were never trained)", gen.context, info.context_length))
  end
  local done = false
  while not done do
    -- a Ctrl-C that lands outside the decode loop (prefill, between turns) ends up here
    local ok, res = pcall(step, c, rl)
    if ok then
      done = res
    elseif is_interrupt(res) then
      c.w:write(" [stopped]\n")
    else
      io_.stderr:write("ember: ", tostring(res), "\n")
    end
  end
  if c.session then c.session:close() end
  return c.total
end

-- main(args, argv, io_) -> exit code; args[1] is "interactive".
function M.main(args, _, io_)
  local o = flags.command({ name = "interactive", spec = flags.spec(M.FLAGS), usage = M.usage }, args, io_)
  if not o then return 0 end
  local path = o.model or require("ember.model.default_model").path()
  local model = flags.load_model(o, { model = path })
  if model.tokenizer == nil then
    flags.usage_error("interactive: the model has no tokenizer; give one with --tokenizer FILE")
  end
  -- readline on a terminal (ember-lua provides it); plain lines otherwise
  local okr, rl = pcall(require, "ember.readline")
  if not okr or not require("ember.store.fs").isatty(0) then rl = M.lines_rl(io.stdin, io_.stdout) end
  M.run(model, rl, io_, { max_tokens = o["max-tokens"], temperature = o.temperature, top_k = o["top-k"],
    top_p = o["top-p"], seed = o.seed, context = o.context })
  model:close()
  return 0
end

return M
