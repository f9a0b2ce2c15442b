-- `ember interactive` (lib/ember/cli/interactive.lua): the loop's logic through a scripted rl table
-- (what a turn prints equals what generate gives for the same ids, /reset, /stats, /help), then a
-- real pseudo-terminal (tmux, as spec/repl_spec.lua does): output streams while the generation
-- runs, Ctrl-C stops it and the next line continues the session, /stats and /reset, Ctrl-D exits.
-- spec/interactive_session_spec.lua holds the equivalence with re-prefilling every turn.

local C = require("helpers.cli")
local fx = require("helpers.fixtures")
local interactive = require("ember.cli.interactive")

local function scripted(lines)
  local i = 0
  return { readline = function() i = i + 1; return lines[i] end, add_history = function() end }
end

describe("ember interactive, scripted", function()
  it("streams each turn, keeps the conversation as ids, and answers /stats, /reset, /help", function()
    local path = C.need_model()
    if not path then return end
    local model = require("ember").load { model = path }
    local out, err = C.sink(), C.sink()
    local writes = 0
    local counting = { write = function(self, ...) writes = writes + 1; out:write(...); return self end,
      flush = function() end }
    local total = interactive.run(model, scripted({ "hello", "/stats", "again", "/reset", "/stats", false, "/help",
      "/bogus", "   ", nil }), { stdout = counting, stderr = err }, { max_tokens = 6 })
    local text = out:text()
    assert.equal("", err:text())
    assert.equal(2, total.turns)
    assert.equal(12, total.generated)
    -- the first turn's expectation, computed independently: the same ids through generate
    local tok = model.tokenizer
    local ids1 = tok:encode("hello\n")
    local g1 = model:generate { ids = ids1, max_tokens = 6 }
    assert.matches("\n" .. g1.text .. "\n", text, 1, true)
    -- the second turn continues the first: its prompt is turn 1's ids, its output, the new line
    local ids2 = {}
    for _, id in ipairs(ids1) do ids2[#ids2 + 1] = id end
    for _, id in ipairs(g1.ids) do ids2[#ids2 + 1] = id end
    for _, id in ipairs(tok:encode("\nagain\n", { bos = false })) do ids2[#ids2 + 1] = id end
    local g2 = model:generate { ids = ids2, max_tokens = 6 }
    assert.matches(g2.text, text, 1, true)
    assert.matches(string.format("last turn: %d new prompt tokens (%d in context), 6 generated (stop: max_tokens)",
      #ids1, #ids1), text, 1, true)
    assert.matches("conversation reset\nno turn yet\n", text, 1, true)
    assert.matches("/reset   forget the conversation", text, 1, true)
    assert.matches("unknown command /bogus (/help lists them)", text, 1, true)
    -- streamed: more writes than lines printed (each token's text is written as it comes)
    local _, lines = text:gsub("\n", "")
    assert.is_true(writes > lines + 6, writes .. " writes for " .. lines .. " lines")
    model:close()
  end)

  it("refuses a conversation that no longer fits the context", function()
    local path = C.need_model()
    if not path then return end
    local model = require("ember").load { model = path }
    local out = C.sink()
    interactive.run(model, scripted({ "hello", nil }), { stdout = out, stderr = C.sink() },
      { max_tokens = 6, context = 8 })
    assert.matches("more than the context (8 positions): /reset to start over", out:text(), 1, true)
    model:close()
  end)
end)

-- ---- a real terminal ------------------------------------------------------------------------

local terminal = require("helpers.terminal")
local sh = terminal.sh

describe("ember interactive in a terminal", function()
  local ember_bin = fx.build .. "/ember"
  local model = fx.root .. "/parity/llama-tiny-f32/model.gguf"
  if not terminal.ready(ember_bin, model) then return end

  local term = terminal.session("ember-interactive-spec", { join = true })
  local session, send, screen = term.name, term.send, term.screen
  local wait_until, wait_for = term.wait_until, term.wait_for
  local count = terminal.count
  -- streaming: the text after the last "> LINE" grows while the generation has not finished
  local function wait_streaming(line)
    return wait_until("output streaming after " .. line, function(s)
      local at
      local from = 1
      while true do
        local a, b = s:find("> " .. line, from, true)
        if not a then break end
        at, from = b, b + 1
      end
      return at ~= nil and #(s:sub(at + 1):gsub("%s", "")) >= 40
    end)
  end

  setup(function()
    sh("tmux new-session -d -s " .. session .. " -x 160 -y 50")
    sh("tmux set-option -t " .. session .. " remain-on-exit on")
    -- a long generation (20000 tokens, reference kernels): Ctrl-C lands while it runs; the context
    -- holds two such turns, so the second fits however many tokens the first made before Ctrl-C
    sh("tmux respawn-pane -k -t " .. session .. " '" .. ember_bin .. " interactive --model " .. model
      .. " --kernels reference --max-tokens 20000 --context 40100 2>/dev/null'")
    wait_for("/help lists commands")
  end)

  teardown(function() sh("tmux kill-session -t " .. session) end)

  it("streams a generation, stops it on Ctrl-C and goes on", function()
    send("hello", "Enter")
    local before = wait_streaming("hello")
    assert.equal(0, count(before, "[stopped]"), before) -- still running: what is shown was streamed
    send("C-c")
    wait_for("[stopped]")
    send("/stats", "Enter")
    local s = wait_for("stop: interrupted")
    local generated = tonumber(s:match("(%d+) generated %(stop: interrupted%)"))
    assert.is_truthy(generated and generated >= 1 and generated < 20000, s)
    assert.matches("1 stopped with Ctrl-C", s, 1, true)
    local before = tonumber(s:match("conversation: (%d+) tokens of context"))
    -- the next line continues the same session: it prefills its own few tokens (and the last
    -- token of the stopped turn if the Ctrl-C came before that one was evaluated)
    send("more", "Enter")
    wait_streaming("more")
    send("C-c")
    wait_for("[stopped]", 2)
    send("/stats", "Enter")
    s = wait_for("2 stopped with Ctrl-C")
    local new, context = s:match("last turn: (%d+) new prompt tokens %((%d+) in context%)[^\n]*\n[^\n]*2 stopped")
    new, context = tonumber(new), tonumber(context)
    assert.is_truthy(new and new < 10 and before, s)
    local line = context - before -- the new line's tokens
    assert.is_true(line >= 1 and (new == line or new == line + 1), s)
  end)

  it("/reset forgets the conversation and the next turn runs (and stops) too", function()
    send("/reset", "Enter")
    wait_for("conversation reset")
    send("/stats", "Enter")
    wait_for("no turn yet")
    send("again", "Enter")
    wait_streaming("again")
    send("C-c")
    wait_for("[stopped]", 2)
    send("/stats", "Enter")
    local s = wait_for("3 stopped with Ctrl-C")
    -- the conversation after /reset: this turn's prompt only ("again\n" with BOS, a few tokens),
    -- all of it new
    local new, context = s:match("last turn: (%d+) new prompt tokens %((%d+) in context%)[^\n]*\n[^\n]*3 stopped")
    assert.is_truthy(new and tonumber(new) < 10 and new == context, s)
  end)

  it("exits on Ctrl-D", function()
    send("C-d")
    local dead = false
    for _ = 1, 200 do
      if sh("tmux display -p -t " .. session .. " '#{pane_dead}'"):match("^1") then dead = true; break end
      os.execute("sleep 0.05")
    end
    assert.is_true(dead, "ember interactive did not exit on Ctrl-D:\n" .. screen())
  end)
end)
