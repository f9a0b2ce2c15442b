-- Outputs before and after the run: a sweep whose --out was left empty by a run that failed at its
-- first write (or was made empty beforehand) resumes there; an output directory that cannot be
-- written is found before the model runs; a trace that lost a write (a full disk) does not stay
-- behind as if it were whole. Permission checks run as nobody (setpriv) when this process is root,
-- where permission bits do not apply; the full disk is a file-size limit (ulimit -f) on a child.

local fs = require("ember.store.fs")
local H = require("helpers.artifacts")
local C = require("helpers.cli")
local fx = require("helpers.fixtures")
local child = require("helpers.child")

local q = fs.shell_quote
local CLEAN, CORRUPTED = "The quick brown cat", "The slow brown fox"

local function sweep(model, out, ...)
  return C.ember("sweep", "--model", model, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out", out,
    "--stages", "after_layer", "--threads", "1", "--progress", "none", "--no-plot", ...)
end

describe("a sweep's --out", function()
  after_each(H.cleanup)

  it("made empty beforehand is accepted and filled", function()
    local model = C.need_model()
    if not model then return end
    local out = H.tmpdir() .. "/out"
    assert(fs.mkdir(out))
    local code, _, err = sweep(model, out)
    assert.equal(0, code, err)
    assert.equal("complete", require("ember.sweep.store").read(out).manifest.status)
  end)

  it("left by a run that failed at its first write resumes on the rerun", function()
    local model = C.need_model()
    if not model then return end
    local out = H.tmpdir() .. "/out"
    -- the first atomic write fails as on a full disk: the run has made --out and nothing else
    local saved = fs.write_atomic
    fs.write_atomic = function(path) error("sweep: cannot write '" .. path .. "': No space left on device", 0) end
    local ok, code, _, err = pcall(sweep, model, out)
    fs.write_atomic = saved
    assert.is_true(ok)
    assert.are_not.equal(0, code)
    assert.matches("No space left on device", err, 1, true)
    assert.same({}, fs.list_dir(out)) -- the state such a failure leaves
    code, _, err = sweep(model, out)
    assert.equal(0, code, err)
    assert.equal("complete", require("ember.sweep.store").read(out).manifest.status)
  end)

  it("holding files that are not a sweep's is refused, naming them", function()
    local model = C.need_model()
    if not model then return end
    local out = H.tmpdir() .. "/out"
    assert(fs.mkdir(out))
    H.write(out .. "/notes.txt", "mine")
    local code, _, err = sweep(model, out)
    assert.are_not.equal(0, code)
    assert.matches("holds no sweep (no manifest.json) but other files (notes.txt)", err, 1, true)
    assert.equal("mine", require("helpers.files").read(out .. "/notes.txt"))
  end)
end)

describe("an unwritable output directory", function()
  after_each(function()
    H.cleanup()
  end)

  it("is refused before the run, for every output of a generation and a sweep's --out", function()
    if child.UID ~= 0 then return pending("needs root to run the command as nobody (id -u = " .. child.UID .. ")") end
    local model = C.need_model()
    if not model then return end
    local dir = H.tmpdir()
    assert(os.execute("chmod 777 " .. q(dir) .. " && mkdir " .. q(dir .. "/ro") .. " && chmod 555 " .. q(dir .. "/ro")
      .. " && cp " .. q(model) .. " " .. q(dir .. "/m.gguf") .. " && chmod 644 " .. q(dir .. "/m.gguf")))
    local cases = {
      { "--capture-activations", "ro/cap" }, { "--activation-stats", "ro/s.json" }, { "--trace", "ro/t.jsonl" },
      { "--dump-layers", "ro/layers" }, { "--dump-logits", "ro/l.safetensors" },
    }
    local code = "local sink = function() local t = {} return { write = function(s, ...) for _, x in ipairs({ ... }) "
      .. "do t[#t + 1] = tostring(x) end return s end, flush = function() end, text = function() "
      .. "return table.concat(t) end } end local got = {} for _, a in ipairs(CASES) do local out, err = sink(), "
      .. "sink() local c = require('ember.cli').main(a, { stdout = out, stderr = err }) got[#got + 1] = c .. ' ' "
      .. ".. out:text() .. '|' .. err:text() end report(table.concat(got, '\\n'))"
    local argv = {}
    for i, c in ipairs(cases) do
      argv[i] = string.format("{ '--model', 'm.gguf', '--prompt', 'hi', '--max-tokens', '1', '--run-manifest', "
        .. "'run%d.json', %q, %q }", i, c[1], c[2])
    end
    argv[#argv + 1] = string.format("{ 'sweep', '--model', 'm.gguf', '--clean', %q, '--corrupted', %q, '--out', "
      .. "'ro/sweep', '--progress', 'none', '--no-plot' }", CLEAN, CORRUPTED)
    local got, why = child.lua(dir, "local CASES = { " .. table.concat(argv, ", ") .. " } " .. code,
      { unprivileged = true, seconds = 120 })
    assert.is_truthy(got, why)
    local lines = {}
    for line in (got[1] .. "\n"):gmatch("(.-)\n") do if line:match("^%d+ ") then lines[#lines + 1] = line end end
    local flags = { "--capture-activations", "--activation-stats", "--trace", "--dump-layers", "--dump-logits",
      "--out" }
    assert.equal(#flags, #lines, got[1])
    for i, line in ipairs(lines) do
      -- a usage error (exit 2) before anything ran: no generated text, the reason named
      assert.matches("^2 |", line, nil, false)
      assert.matches(flags[i] .. ": cannot write in directory 'ro' (Permission denied)", line, 1, true)
    end
    assert.same({}, fs.list_dir(dir .. "/ro"))
  end)
end)

describe("a trace that loses a write", function()
  it("is removed, not left partial (a full disk: ulimit -f)", function()
    local model = C.need_model()
    if not model then return end
    local lua = fx.build .. "/ember-lua"
    if not fx.exists(lua) then return pending("missing " .. lua) end
    if lua:sub(1, 1) ~= "/" then lua = os.getenv("PWD") .. "/" .. lua end
    local dir = H.tmpdir()
    -- 64 blocks of 512 bytes: the trace of 8 tokens is several times larger; SIGXFSZ ignored, so
    -- the write fails with EFBIG instead of ending the process
    local cmd = string.format("cd %s && trap '' XFSZ && ulimit -f 64 && EMBER_LIB=%s %s -m ember.cli --model %s "
      .. "--prompt hi --max-tokens 8 --trace t.jsonl --run-manifest run.json >/dev/null 2>err.txt", q(dir),
      q(os.getenv("PWD") .. "/lib"), q(lua), q(model))
    local ok = os.execute(cmd)
    local err = require("helpers.files").read(dir .. "/err.txt")
    assert.is_falsy(ok, err)
    assert.matches("trace: writing 't.jsonl' failed (disk full?); the partial trace was removed", err, 1, true)
    assert.is_false(fs.exists(dir .. "/t.jsonl"), "the partial trace was left behind")
  end)
end)
