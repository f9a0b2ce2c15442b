-- Every file ember reads goes through one gate (fs.read on core.read_file): regular files only, each
-- kind with its size bound. Here each reader meets a FIFO (opening one for reading used to wait for
-- a writer forever) and /dev/zero (read until memory ran out), in a child process with a time and
-- an address-space limit, so a hang or a runaway read is this spec's failure: each must refuse the
-- path at once, naming it and saying what it is.

local fs = require("ember.store.fs")
local child = require("helpers.child")
local H = require("helpers.artifacts")

local q = fs.shell_quote

-- special(kind, path): a FIFO at path, or a link to /dev/zero.
local function special(kind, path)
  if kind == "fifo" then assert(os.execute("mkfifo " .. q(path)))
  else assert(os.execute("ln -s /dev/zero " .. q(path))) end
end
local SAYS = { fifo = "is a FIFO (named pipe)", zero = "is a character device" }

-- the readers: { name, the file it reads inside DIR (made special), Lua code that reads through the
-- command or module, calling report(message) with the error it gave [, setup(DIR)] }
local CLI = "local sink = function() local t = {} return { write = function(s, ...) for _, x in ipairs({ ... }) do "
  .. "t[#t + 1] = tostring(x) end return s end, flush = function() end, text = function() return table.concat(t) "
  .. "end } end local out, err = sink(), sink() local code = require('ember.cli').main(ARGS, { stdout = out, "
  .. "stderr = err }) report(code .. ' ' .. err:text())"
local function cli(args) return (CLI:gsub("ARGS", function() return args end)) end
local function call(expr) return "local ok, e = pcall(function() return " .. expr .. " end) report(tostring(e))" end

local READERS = {
  { "compare-artifacts: manifest.json", "a/manifest.json", cli("{ 'compare-artifacts', DIR .. '/a', DIR .. '/a' }") },
  { "compare-artifacts: tensors.safetensors", "t/tensors.safetensors",
    cli("{ 'compare-artifacts', DIR .. '/t', DIR .. '/t' }"), function(dir) -- a real artifact, its tensors replaced
      require("ember.store.artifact").write(dir .. "/t", H.sections(), H.records())
      os.remove(dir .. "/t/tensors.safetensors")
    end },
  { "sweep compare: manifest.json", "s/manifest.json", cli("{ 'sweep', 'compare', DIR .. '/s', DIR .. '/s' }") },
  { "sweep merge: a shard's manifest.json", "s/manifest.json",
    cli("{ 'sweep', 'merge', DIR .. '/merged', DIR .. '/s' }") },
  { "sweep resume: --out's manifest.json", "s/manifest.json",
    call("require('ember.sweep.store').read_for_resume(DIR .. '/s', {})") },
  { "--prompts", "p.jsonl", call("require('ember.analysis.extract').read_prompts(DIR .. '/p.jsonl', '--prompts')") },
  { "probe --data (an extraction's sidecar)", "x.json",
    call("require('ember.analysis.extract').read(DIR .. '/x.safetensors')") },
  { "probe --probe", "probe.json", cli("{ 'probe', 'eval', '--probe', DIR .. '/probe.json', '--data', 'x' }") },
  { "probe.load_probe", "probe.json", call("require('ember.analysis.probe').load_probe(DIR .. '/probe.json')") },
  { "sae top: a shard's top.json", "t/top.json", call("require('ember.sae.top').read(DIR .. '/t')") },
  { "ember.load_tensors", "v.safetensors", call("require('ember.store.tensor_file').load(DIR .. '/v.safetensors')") },
  { "--steer FILE.npy", "v.npy", call("require('ember.store.vector_file').read(DIR .. '/v.npy')") },
  { "compare-models merge: report.json", "r/report.json",
    cli("{ 'compare-models', 'merge', DIR .. '/merged', DIR .. '/r' }") },
}

describe("every reader refuses a FIFO and /dev/zero", function()
  after_each(H.cleanup)
  for _, kind in ipairs({ "fifo", "zero" }) do
    for _, r in ipairs(READERS) do
      it(r[1] .. " (" .. kind .. ")", function()
        local dir = H.tmpdir()
        local path = dir .. "/" .. r[2]
        if r[4] then r[4](dir) end
        assert(os.execute("mkdir -p " .. q(fs.dirname(path))))
        if r[2] == "x.json" then H.write(dir .. "/x.safetensors", "") end
        special(kind, path)
        local got, why = child.lua(dir, "local DIR = " .. string.format("%q", dir) .. " " .. r[3],
          { seconds = 30, memory_kb = 2 * 1024 * 1024 })
        assert.is_truthy(got, why)
        local msg = got[1]
        assert.is_truthy(msg:find(path, 1, true), msg)
        assert.is_truthy(msg:find(SAYS[kind], 1, true), msg)
      end)
    end
  end
end)
