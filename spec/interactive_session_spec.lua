-- `ember interactive` keeps one session for the conversation: a scripted conversation (several
-- turns, greedy and sampled, a turn stopped by Ctrl-C, a turn ending in EOS, /reset) gives, turn by
-- turn, the ids and text of the loop that prefilled the whole conversation again each turn
-- (re-implemented here on model:generate{ids=}), and each turn prefills only its new tokens.

local C = require("helpers.cli")
local interactive = require("ember.cli.interactive")

local function append(dst, src, n)
  return table.move(src, 1, n or #src, #dst + 1, dst)
end

-- A tokenizer that is `real` in everything but its eos_id (so that a turn ends in EOS on a model
-- whose real EOS never comes up).
local function with_eos(real, eos)
  return setmetatable({ eos_id = eos }, { __index = function(_, k)
    local v = real[k]
    if type(v) == "function" then return function(_, ...) return v(real, ...) end end
    return v
  end })
end

-- The reference: the conversation as ids, and every turn one generate{ids=} over all of it.
-- stop_at = { turn = T, chunk = K [, error = msg] }: in turn T, Ctrl-C lands while the K-th piece
-- of text is being printed (raised from on_token, as ember-lua's interrupt is in whatever Lua code
-- runs); with error=, that write fails instead, which fails the turn (it is not kept).
local function reference(model, lines, gen, stop_at)
  local tok = model.tokenizer
  local conv, turns, lines_run, results = {}, 0, 0, {}
  for _, line in ipairs(lines) do
    if line == "/reset" then
      conv = {}
    elseif line:sub(1, 1) ~= "/" then
      local add = #conv == 0 and tok:encode(line .. "\n") or tok:encode("\n" .. line .. "\n", { bos = false })
      local ids = append(append({}, conv), add)
      local on_token = nil
      lines_run = lines_run + 1 -- (a failed turn is a line run, not a turn kept)
      if stop_at and stop_at.turn == lines_run then
        local stream, chunks = tok:stream { exact = true }, 0
        on_token = function(id)
          if id == tok.eos_id then return end
          if #stream:push(id) > 0 then
            chunks = chunks + 1
            if chunks == stop_at.chunk then error(stop_at.error or "interrupted", 0) end
          end
        end
      end
      local ok, out = pcall(model.generate, model, { ids = ids, max_tokens = gen.max_tokens,
        temperature = gen.temperature or 0.0, top_k = gen.top_k or 0, top_p = gen.top_p or 1.0,
        seed = (gen.seed or 0) + turns, context = gen.context, on_token = on_token })
      if ok then
        turns = turns + 1
        results[#results + 1] = { ids = out.ids, text = out.text, stop = out.stop }
        conv = append(ids, out.ids, #out.ids - (out.stop == "eos" and 1 or 0))
      end
    end
  end
  return results
end

-- The loop under test, over the same lines; the Ctrl-C of stop_at is raised by the terminal's
-- write of that piece. Returns the turns (on_turn's records), the totals, the printed text and
-- what went to stderr.
local function chat(model, lines, gen, stop_at)
  local turns, text, writes, armed = {}, {}, 0, false
  local i, n_turn = 0, 0
  local rl = { add_history = function() end, readline = function()
    i = i + 1
    local line = lines[i]
    if line and line:sub(1, 1) ~= "/" then
      n_turn = n_turn + 1
      armed, writes = stop_at ~= nil and stop_at.turn == n_turn, 0
    end
    return line
  end }
  local out = { write = function(self, ...)
    if armed then
      writes = writes + 1
      if writes == stop_at.chunk then
        armed = false
        error(stop_at.error or "interrupted", 0)
      end
    end
    for _, s in ipairs({ ... }) do text[#text + 1] = s end
    return self
  end }
  local err = C.sink()
  local opts = {}
  for k, v in pairs(gen) do opts[k] = v end
  opts.on_turn = function(t) turns[#turns + 1] = t end
  local total = interactive.run(model, rl, { stdout = out, stderr = err }, opts)
  if not (stop_at and stop_at.error) then assert.equal("", err:text()) end
  return turns, total, table.concat(text), err:text()
end

local function same_turns(want, got)
  assert.equal(#want, #got, "turns")
  for k, w in ipairs(want) do
    assert.same(w.ids, got[k].ids, "turn " .. k .. " ids")
    assert.equal(w.text, got[k].text, "turn " .. k .. " text")
    assert.equal(w.stop, got[k].stop, "turn " .. k .. " stop")
  end
end

local function stops(turns, why)
  local n = 0
  for _, t in ipairs(turns) do if t.stop == why then n = n + 1 end end
  return n
end

local LINES = { "hello", "how are you", "/stats", "tell me more", "and then", "/reset", "start over", "go on" }

-- Each turn's own tokens, from the tokenizer: the first line of a conversation with BOS, the
-- others after the last continuation on a new line.
local function line_tokens(tok)
  local out, first = {}, true
  for _, line in ipairs(LINES) do
    if line == "/reset" then
      first = true
    elseif line:sub(1, 1) ~= "/" then
      out[#out + 1] = first and tok:encode(line .. "\n") or tok:encode("\n" .. line .. "\n", { bos = false })
      first = false
    end
  end
  return out
end

describe("ember interactive keeps one session", function()
  -- loaded on the first test that runs; a missing model makes each test pending, not passed
  local need_model = require("helpers.models").lazy_default()

  it("gives the ids and text of the re-prefilling loop, greedy, with a turn stopped by Ctrl-C", function()
    local model = need_model()
    if not model then return end
    local gen, stop_at = { max_tokens = 8 }, { turn = 3, chunk = 2 }
    local want = reference(model, LINES, gen, stop_at)
    local got, total, text = chat(model, LINES, gen, stop_at)
    same_turns(want, got)
    assert.equal(1, stops(got, "interrupted"))
    assert.equal(1, total.interrupted)
    assert.matches(" [stopped]\n", text, 1, true)
  end)

  it("gives the same with temperature, top-k, top-p and a seed, and with --context", function()
    local model = need_model()
    if not model then return end
    for _, gen in ipairs({
      { max_tokens = 7, temperature = 0.9, top_k = 40, top_p = 0.95, seed = 11 },
      { max_tokens = 7, temperature = 1.3, seed = 3, context = 120 },
    }) do
      local stop_at = { turn = 2, chunk = 3 }
      local want = reference(model, LINES, gen, stop_at)
      local got = chat(model, LINES, gen, stop_at)
      same_turns(want, got)
      assert.equal(1, stops(got, "interrupted"))
    end
  end)

  it("gives the same when a turn ends in EOS (the EOS is not kept in the session)", function()
    local model = need_model()
    if not model then return end
    local real = model.tokenizer
    -- an EOS that the greedy continuation of the second turn reaches: its third generated id
    local probe = reference(model, LINES, { max_tokens = 8 })
    finally(function() model:set_tokenizer(real) end)
    model:set_tokenizer(with_eos(real, probe[2].ids[3]))
    local gen = { max_tokens = 8 }
    local want = reference(model, LINES, gen)
    local got = chat(model, LINES, gen)
    assert.is_true(stops(got, "eos") >= 1, "no turn ended in EOS")
    same_turns(want, got)
    -- and the turn after an EOS prefilled its own line only (no refill of the conversation)
    local lines = line_tokens(real)
    for k, t in ipairs(got) do assert.same(lines[k], t.new_ids, "turn " .. k) end
    assert.is_true(got[#got].context_tokens > #got[#got].new_ids)
  end)

  it("gives the same when a turn fails after its prefill (the session is started again)", function()
    local model = need_model()
    if not model then return end
    local gen, stop_at = { max_tokens = 8 }, { turn = 2, chunk = 2, error = "the terminal is gone" }
    local want = reference(model, LINES, gen, stop_at)
    local got, _, _, err = chat(model, LINES, gen, stop_at)
    assert.matches("ember: the terminal is gone", err, 1, true)
    same_turns(want, got)
    -- the failed turn was not kept: the next one refills the conversation as it was before it
    assert.equal(#want, #LINES - 3)
    assert.equal(got[2].context_tokens, #got[2].new_ids)
  end)

  it("gives the same when the conversation outgrows its session and is refilled", function()
    local model = need_model()
    if not model then return end
    local min = interactive.MIN_SESSION
    finally(function() interactive.MIN_SESSION = min end)
    interactive.MIN_SESSION = 1 -- the first session holds the first turn only
    local gen = { max_tokens = 8, temperature = 0.7, seed = 5 }
    local want = reference(model, LINES, gen)
    local got = chat(model, LINES, gen)
    same_turns(want, got)
    -- the second turn is the refilled one: the whole conversation was prefilled again
    assert.equal(got[2].context_tokens, #got[2].new_ids)
  end)

  it("prefills only each turn's new tokens, and says so in /stats", function()
    local model = need_model()
    if not model then return end
    local tok = model.tokenizer
    local gen, stop_at = { max_tokens = 8, context = 200 }, { turn = 2, chunk = 2 }
    local got, total, text = chat(model, LINES, gen, stop_at)
    -- independently: each line's own tokens; after the Ctrl-C of turn 2 (raised while its last
    -- kept token was being printed, before that token was evaluated) that token comes first
    local line_ids = line_tokens(tok)
    assert.equal(#line_ids, #got)
    assert.equal("interrupted", got[2].stop)
    local context, prefilled = 0, 0
    for k, t in ipairs(got) do
      local want = append({}, line_ids[k])
      if k == 3 then table.insert(want, 1, got[2].ids[#got[2].ids]) end
      if k == 5 then context = 0 end -- /reset
      assert.same(want, t.new_ids, "turn " .. k)
      context = context + #line_ids[k]
      assert.equal(context, t.context_tokens, "turn " .. k .. " context")
      context = context + #t.ids - (t.stop == "eos" and 1 or 0)
      prefilled = prefilled + #t.new_ids
    end
    assert.equal(prefilled, total.prefilled)
    assert.matches(string.format("last turn: %d new prompt tokens (%d in context), %d generated",
      #got[2].new_ids, got[2].context_tokens, #got[2].ids), text, 1, true)
  end)
end)
