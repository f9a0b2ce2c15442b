-- The REPL of ember-lua: its Lua logic directly (compile, printing, completion), then a scripted
-- session in a real pseudo-terminal (tmux) that loads a model, prints a tensor, recalls history
-- and completes names with Tab.

local repl = require("ember.cli.repl")
local fx = require("helpers.fixtures")

describe("ember.repl logic", function()
  it("compiles expressions, =expr and statements, and spots incomplete chunks", function()
    assert.are.equal(3, repl.compile("1 + 2")())
    assert.are.equal(3, repl.compile("=1 + 2")())
    assert.is_nil(repl.compile("local x = 1")())
    local fn, msg, incomplete = repl.compile("for i = 1, 2 do")
    assert.is_nil(fn)
    assert.is_true(incomplete, msg)
    fn, msg, incomplete = repl.compile("1 +* 2")
    assert.is_nil(fn)
    assert.is_false(incomplete)
    assert.is_truthy(msg:find("syntax error", 1, true) or msg:find("unexpected symbol", 1, true), msg)
  end)

  it("formats values readably", function()
    assert.are.equal("1\tx\tnil", repl.format(1, "x", nil))
    assert.are.equal('{1, 2, a = "b"}', repl.format({ 1, 2, a = "b" }))
    local t = {}
    t.self = t
    assert.are.equal("{self = <cycle>}", repl.format(t))
  end)

  it("completes globals, fields and methods of tables and ember userdata", function()
    local ember = require("ember")
    local env = { ember = ember, tens = ember.tensor(1, 2), x = { alpha = 1, beta = function() end } }
    assert.are.same({ "ember.tensor", "ember.tensor_from_bytes" }, repl.complete("ember.tens", env))
    assert.are.same({ "x.alpha", "x.beta" }, repl.complete("x.", env))
    assert.are.same({ "x:beta" }, repl.complete("x:", env)) -- only functions after ':'
    local methods = repl.complete("tens:", env)
    assert.is_truthy(#methods > 10)
    for _, want in ipairs({ "tens:l2_norm", "tens:argmax", "tens:copy_from" }) do
      local found = false
      for _, m in ipairs(methods) do found = found or m == want end
      assert.is_true(found, want)
    end
    assert.are.same({ "tens" }, repl.complete("ten", env))
    assert.are.same({}, repl.complete("nosuch.x", env))
    assert.are.same({ "while" }, repl.complete("whi", env))
  end)

  it("drives a whole session through a scripted rl table", function()
    local lines = { "x = 40", "for i = 1, 2 do", "x = x + 1", "end", "=x", false, "error('boom')", nil }
    local i, history, out = 0, {}, {}
    local real_write = io.write
    local rl = {
      readline = function()
        i = i + 1
        return lines[i]
      end,
      add_history = function(l) history[#history + 1] = l end,
    }
    local stdout, stderr = io.stdout, io.stderr
    -- capture what the REPL prints
    local sink = { write = function(self, ...)
      for _, s in ipairs({ ... }) do out[#out + 1] = tostring(s) end
      return self
    end }
    io.write = function(...) return sink:write(...) end
    io.stdout, io.stderr = sink, sink
    local ok, err = pcall(repl.run, rl)
    io.write, io.stdout, io.stderr = real_write, stdout, stderr
    assert.is_true(ok, err)
    local text = table.concat(out)
    assert.is_truthy(text:find("\n42\n", 1, true), text)
    assert.is_truthy(text:find("boom", 1, true), text)
    assert.are.same({ "x = 40", "for i = 1, 2 do\nx = x + 1\nend", "=x", "error('boom')" }, history)
  end)
end)

describe("help()", function()
  local help = require("ember.cli.help")
  local ember = require("ember")

  it("has a line for every function of the ember module and every method of every class", function()
    local missing = {}
    for k, v in pairs(ember) do
      if type(v) == "function" and not help.MODULE[k] then missing[#missing + 1] = "ember." .. k end
    end
    local path = require("helpers.fixtures").api_model()
    local objects = { ember.tensor(1, 1) }
    if path then
      local m = ember.load(path)
      local s = m:session { context = 4 }
      objects[#objects + 1], objects[#objects + 2], objects[#objects + 3] = m, s, m.tokenizer
      objects[#objects + 1] = ember.sampler { n_vocab = 4 }
    end
    -- views and contexts exist only inside a hook
    local exp = { name = "grab" }
    function exp:after_logits(ctx, v)
      objects[#objects + 1], objects[#objects + 2] = ctx, v
      for _, name in ipairs(help.members(v)) do
        if not help.CLASSES["ember.TensorView"][name] then missing[#missing + 1] = "ember.TensorView." .. name end
      end
    end
    if path then ember.load(path):session { context = 4 }:prefill({ 1 }, { experiment = exp }) end
    for _, obj in ipairs(objects) do
      local cname = getmetatable(obj).__name
      local lines = help.CLASSES[cname]
      if not lines then
        missing[#missing + 1] = cname
      elseif cname ~= "ember.TensorView" then
        for _, name in ipairs(help.members(obj)) do
          if not lines[name] then missing[#missing + 1] = cname .. "." .. name end
        end
      end
    end
    assert.are.same({}, missing, "add a line to lib/ember/cli/help.lua for: " .. table.concat(missing, ", "))
  end)

  it("lists the module, an object's methods, and a function's line", function()
    local text = help.text()
    assert.is_truthy(text:find("ember.now() -> wall-clock seconds", 1, true), text)
    assert.is_truthy(text:find("ember.load{", 1, true), text)
    local t = help.text(ember.tensor(1, 2))
    assert.is_truthy(t:match("^ember.Tensor:\n"), t)
    assert.is_truthy(t:find("t:top1() -> per row", 1, true), t)
    assert.are.equal(help.MODULE.save_tensors .. "\n", help.text(ember.save_tensors))
    assert.is_truthy(help.text(42):find("a number", 1, true))
  end)

  it("ember.now() is the wall clock in seconds, finer than os.time", function()
    local a = ember.now()
    assert.is_true(math.abs(a - os.time()) <= 1.5)
    local b
    repeat b = ember.now() until b ~= a
    assert.is_true(b > a and b - a < 0.5)
    assert.is_true(a ~= math.floor(a) or b ~= math.floor(b)) -- sub-second resolution
  end)
end)

-- ---- a real terminal ------------------------------------------------------------------------

local terminal = require("helpers.terminal")
local sh = terminal.sh

describe("ember-lua REPL in a terminal", function()
  local binary = fx.build .. "/ember-lua"
  local model = fx.root .. "/parity/llama-tiny-f32/model.gguf"
  if not terminal.ready(binary, model) then return end

  local term = terminal.session("ember-repl-spec")
  local session, send, screen, wait_for = term.name, term.send, term.screen, term.wait_for
  local history = os.tmpname()

  setup(function()
    os.remove(history)
    sh("tmux new-session -d -s " .. session .. " -x 160 -y 50")
    sh("tmux set-option -t " .. session .. " remain-on-exit on")
    sh("tmux respawn-pane -k -t " .. session .. " 'env EMBER_HISTORY=" .. history .. " " .. binary .. " 2>&1'")
    wait_for("Ctrl-D exits.")
  end)

  teardown(function()
    sh("tmux kill-session -t " .. session)
    os.remove(history)
  end)

  it("loads a model and prints a tensor", function()
    send('m = ember.load{model="' .. model .. '", kernels="reference"}', "Enter")
    send("m", "Enter")
    wait_for("ember.Model(llama")
    send("t = m:session{context=32}:prefill{1, 2, 3}", "Enter")
    send("t", "Enter")
    local s = wait_for("ember.Tensor[1, 8192] f32 {")
    assert.is_truthy(s:find("l2=", 1, true))
  end)

  it("accepts multi-line input and =expr", function()
    send("for i = 1, 3 do", "Enter")
    wait_for(">>")
    send("io.write('row', i, ' ')", "Enter", "end", "Enter")
    wait_for("row1 row2 row3")
    send("=6 * 7", "Enter")
    wait_for("\n42\n")
  end)

  it("recalls history with the Up arrow and keeps it in the history file", function()
    send("=6 * 7", "Enter") -- fresh line to recall
    wait_for("\n42\n", 2)
    send("Up", "Enter")
    wait_for("\n42\n", 3)
    local f = assert(io.open(history, "rb"))
    local text = f:read("a")
    f:close()
    assert.is_truthy(text:find("=6 * 7", 1, true), text)
    assert.is_truthy(text:find("kernels=\"reference\"", 1, true), text)
  end)

  it("completes methods of ember userdata and fields with Tab", function()
    send("m:sessi", "Tab")
    wait_for("> m:session")
    send("C-u")
    send("t:l2", "Tab")
    wait_for("> t:l2_norm")
    send("()", "Enter")
    wait_for("\n91.61")
    send("ember.tensor_fr", "Tab")
    wait_for("> ember.tensor_from_bytes")
    send("C-u")
  end)

  -- Whether the pane's process has exited (tmux's own flag; the "Pane is dead" banner it draws
  -- can lag behind, so the screen is not the test).
  local function pane_dead(target)
    for _ = 1, 200 do
      if sh("tmux display -p -t " .. target .. " '#{pane_dead}'"):match("^1") then return true end
      os.execute("sleep 0.05")
    end
    return false
  end

  it("-i runs the script, then opens the REPL with one banner and the script's globals", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "wb"))
    f:write("answer = 41 + 1\nprint('script ran')\n")
    f:close()
    local other = session .. "-i"
    sh("tmux new-session -d -s " .. other .. " -x 160 -y 50")
    sh("tmux respawn-pane -k -t " .. other .. " 'env EMBER_HISTORY=" .. history .. " " .. binary .. " -i " .. script
      .. " 2>&1'")
    term.name = other -- send/screen/wait_for address this pane for the moment
    local ok, err = pcall(function()
      wait_for("Ctrl-D exits.")
      send("=answer, type(ember)", "Enter")
      local s = wait_for("table") -- the command line itself does not contain it
      assert.is_truthy(s:match("\n42%s+table\n"), s)
      local _, banners = s:gsub("ember%-lua %d", "")
      assert.are.equal(1, banners, s)
      assert.is_truthy(s:find("script ran", 1, true), s)
    end)
    term.name = session
    sh("tmux kill-session -t " .. other)
    os.remove(script)
    assert(ok, err)
  end)

  it("help() and help(obj) print one line per function and method", function()
    send("help()", "Enter")
    wait_for("ember.now() -> wall-clock")
    send("help(m)", "Enter")
    wait_for("m:session{ context = N } -> Session")
  end)

  it("Ctrl-C during a generation keeps what was generated, with stop = interrupted", function()
    -- the word is printed in two pieces so that the echoed command line cannot match it: Ctrl-C
    -- must land once the decode loop is running
    send("n = 0; out = m:generate{ ids = {1, 2, 3}, max_tokens = 20000, context = 20004, eos = false, "
      .. "on_token = function() n = n + 1 if n == 50 then io.write('gene', 'rating\\n') end end }", "Enter")
    wait_for("generating")
    send("C-c")
    -- on_token saw every kept token, except perhaps the last when Ctrl-C fell just before its call
    send("=out.stop, #out.ids >= 50, #out.ids < 20000, #out.ids - n <= 1", "Enter")
    local s = wait_for("interrupted")
    assert.is_truthy(s:match("interrupted%s+true%s+true%s+true"), s)
    -- the next generation is not stopped by the Ctrl-C already handled
    send("=m:generate{ ids = {1, 2, 3}, max_tokens = 3 }.stop", "Enter")
    wait_for("\nmax_tokens\n")
  end)

  it("survives Ctrl-C during a computation and exits on Ctrl-D", function()
    -- wait for the loop to be running (and later for the prompt) before each key, so a slow
    -- machine cannot turn Ctrl-C into "abandon this line"
    send("io.write('spin', 'ning\\n') while true do end", "Enter")
    wait_for("spinning")
    send("C-c")
    wait_for("interrupted")
    send("=1 + 1", "Enter")
    wait_for("\n2\n>")
    send("C-d")
    assert.is_true(pane_dead(session), "the REPL did not exit on Ctrl-D:\n" .. screen())
  end)
end)
