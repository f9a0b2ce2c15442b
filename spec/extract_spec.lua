-- Hidden-state extraction (`ember --extract-hidden LAYERS --extract-out FILE`, lib/ember/analysis/extract.lua):
-- the file is opened by an independent safetensors reader (python3 json + struct, written from the
-- format) and every tensor equals what an after_layer hook sees in the same prefill; the sidecar's
-- provenance; bad input names the flag, file and line.

local C = require("helpers.cli")
local ember_cli, need_model = C.ember, C.need_model
local fs = require("ember.store.fs")
local read_file = require("helpers.files").read
local json = require("ember.store.json")

local write = require("helpers.artifacts").write

-- whether the independent reader can run; if not, the test is pending, saying why
local function need_python()
  if os.execute("python3 -c 'import json, struct, hashlib' >/dev/null 2>&1") == true then return true end
  pending("python3 with json, struct and hashlib is not available: the independent reader cannot run")
  return false
end

-- The independent reader: the 8-byte little-endian header length, the JSON header, the data
-- offsets; prints one line per tensor: name dtype rows cols sha256-of-its-bytes.
local PY_READER = [[
import hashlib, json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
base = 8 + n
for name, e in sorted(header.items()):
    if name == "__metadata__":
        continue
    b, end = e["data_offsets"]
    raw = data[base + b:base + end]
    rows, cols = e["shape"]
    assert len(raw) == rows * cols * 4, name
    # every value must be a finite float32 (decoded, not just hashed)
    vals = struct.unpack("<%df" % (rows * cols), raw)
    assert all(v == v and abs(v) != float("inf") for v in vals), name
    print(name, e["dtype"], rows, cols, hashlib.sha256(raw).hexdigest())
]]

local function python_read(path)
  local script = os.tmpname()
  write(script, PY_READER)
  local p = io.popen("python3 " .. fs.shell_quote(script) .. " " .. fs.shell_quote(path) .. " 2>&1")
  local text = p:read("a")
  local ok = p:close()
  os.remove(script)
  assert(ok, "the python reader failed: " .. text)
  local out = {}
  for name, dtype, rows, cols, sha in text:gmatch("(%S+) (%S+) (%d+) (%d+) (%x+)\n") do
    out[name] = { dtype = dtype, rows = tonumber(rows), cols = tonumber(cols), sha256 = sha }
  end
  return out
end

describe("ember --extract-hidden", function()
  local dir
  before_each(function() dir = fs.make_temp_dir("ember-extract-spec") end)
  after_each(function() fs.remove_tree(dir) end)

  it("writes what an after_layer hook sees, readable by an independent safetensors reader", function()
    local model_path = need_model()
    if not model_path then return end
    if not need_python() then return end
    local prompts = { "The quick brown fox", "jumps over the lazy dog.", "a" }
    local jsonl = fs.join(dir, "prompts.jsonl")
    write(jsonl, string.format('{"prompt": %s, "label": "x"}\n\n{"prompt": %s}\n{"prompt": %s, "label": 3}\n',
      json.string(prompts[1]), json.string(prompts[2]), json.string(prompts[3])))
    local out = fs.join(dir, "hidden.safetensors")
    local code, stdout, err = ember_cli("--model", model_path, "--prompts", jsonl, "--extract-hidden", "0,2-3",
      "--extract-out", out)
    assert.equal(0, code, err)
    assert.equal("", stdout)
    assert.matches("extracted layers 0,2,3 of 3 prompts", err, 1, true)

    -- the same prefills, seen by a hook of our own
    local ember = require("ember")
    local model = ember.load { model = model_path }
    local seen = {}
    for i, text in ipairs(prompts) do
      local hook = { name = "spec_reader", after_layer = function(_, ctx, view)
        if ctx.phase == "prefill" then
          seen[string.format("hidden.p%d.L%d", i - 1, ctx.layer_index)] = { sha256 = ember.sha256(view:bytes()),
            rows = view:shape()[1], cols = view:shape()[2] }
        end
      end }
      model:generate { prompt = text, max_tokens = 0, experiment = hook }
    end
    local hidden = model.info.hidden_size
    local sha = require("ember.store.manifest").model_sha256(model)
    model:close()

    local read = python_read(out)
    local n = 0
    for name, t in pairs(read) do
      n = n + 1
      assert.equal("F32", t.dtype, name)
      assert.equal(hidden, t.cols, name)
      assert.is_not_nil(seen[name], name)
      assert.equal(seen[name].rows, t.rows, name)
      assert.equal(seen[name].sha256, t.sha256, name)
    end
    assert.equal(3 * 3, n) -- 3 prompts x layers 0, 2, 3: nothing more, nothing less

    -- the sidecar: provenance and the prompts with their labels, bound to the tensor file
    local doc = json.decode(read_file(fs.join(dir, "hidden.json")))
    assert.equal("ember.hidden_states", doc.schema)
    assert.equal("after_layer", doc.stage)
    assert.same({ 0, 2, 3 }, doc.layers)
    assert.equal(sha, doc.model.sha256)
    assert.equal(ember.sha256(read_file(out)), doc.tensor_file.sha256)
    assert.equal(ember.sha256(read_file(jsonl)), doc.data.sha256)
    assert.equal("x", doc.prompts[1].label)
    assert.equal(json.null, doc.prompts[2].label)
    assert.equal(3, doc.prompts[3].label)
    assert.equal(4, doc.prompts[3].line) -- the blank line counts
    assert.equal(prompts[2], doc.prompts[2].prompt.text)
    assert.equal(read["hidden.p1.L2"].rows, #doc.prompts[2].input_ids)
    -- and ember's own reader accepts the pair
    local back = require("ember.analysis.extract").read(out)
    assert.equal(3, #back.sidecar.prompts)
  end)

  it("keeps what a hook sees in the very same prefill (the reader composed with an observer)", function()
    local model_path = need_model()
    if not model_path then return end
    if not need_python() then return end
    local ember, extract = require("ember"), require("ember.analysis.extract")
    local model = ember.load { model = model_path }
    local reader, seen = extract.reader({ 1, 4 }), {}
    -- the observer comes after the reader: both see one and the same view of each layer
    local observer = { name = "spec_observer", after_layer = function(_, ctx, view)
      if ctx.phase == "prefill" then seen[ctx.layer_index] = ember.sha256(view:bytes()) end
    end }
    local out = model:generate { prompt = "same run", max_tokens = 0,
      experiment = require("ember.run.compose").compose({ reader, observer }) }
    local file = fs.join(dir, "same.safetensors")
    extract.write(file, { { prompt = "same run", ids = out.prompt_ids, hidden = reader.hidden } },
      { model = model, layers = { 1, 4 },
        data = { source = "prompt", path = json.null, sha256 = ember.sha256("same run") } })
    model:close()
    local read = python_read(file)
    assert.equal(seen[1], read["hidden.p0.L1"].sha256)
    assert.equal(seen[4], read["hidden.p0.L4"].sha256)
    assert.is_nil(read["hidden.p0.L2"])
  end)

  it("ember.extract_hidden gives the same rows as tensors, and names bad arguments", function()
    local model_path = need_model()
    if not model_path then return end
    local ember = require("ember")
    local model = ember.load { model = model_path }
    local res = ember.extract_hidden { model = model, prompts = { "abc", { prompt = "de f", label = 2 } },
      layers = "1-2" }
    assert.equal(2, #res)
    assert.equal(2, res[2].label)
    local seen = {}
    model:generate { prompt = "de f", max_tokens = 0, experiment = { name = "spec_rows",
      after_layer = function(_, ctx, v)
      if ctx.phase == "prefill" then seen[ctx.layer_index] = v:sha256() end
    end } }
    assert.same({ #res[2].ids, model.info.hidden_size }, res[2].hidden[2]:shape())
    assert.equal(seen[1], res[2].hidden[1]:sha256())
    assert.equal(seen[2], res[2].hidden[2]:sha256())
    assert.is_nil(res[2].hidden[0])
    for _, c in ipairs({
      { { model = model, prompts = {} }, "prompts= must be a non-empty list" },
      { { model = model, prompts = { 5 } }, "prompts[1] must be a string" },
      { { model = model, prompts = { "x" }, layers = "9" }, "layers: layer 9 is out of range" },
      { { model = model, prompts = { "x" }, layers = "1,x" }, "layers: expected 'all'" },
      { { model = model, prompts = { "x" }, experiment = {} }, "experiment" },
      { { prompts = { "x" } }, "model= is required" },
    }) do
      local ok, err = pcall(ember.extract_hidden, c[1])
      assert.is_false(ok)
      assert.matches(c[2], tostring(err), 1, true)
    end
    model:close()
  end)

  it("extracts one --prompt the same way, byte for byte across runs", function()
    local model_path = need_model()
    if not model_path then return end
    local a, b = fs.join(dir, "a.safetensors"), fs.join(dir, "b.safetensors")
    for _, out in ipairs({ a, b }) do
      local code, _, err = ember_cli("--model", model_path, "--prompt", "hello world", "--extract-hidden", "all",
        "--extract-out", out)
      assert.equal(0, code, err)
    end
    -- the files differ only in the sidecar name they carry: the tensors are byte-identical
    local st = require("ember.store.safetensors")
    local ta, tb = st.decode(read_file(a)), st.decode(read_file(b))
    assert.same(ta.names, tb.names)
    for _, name in ipairs(ta.names) do
      assert.equal(require("ember").sha256(ta.tensors[name].data), require("ember").sha256(tb.tensors[name].data), name)
    end
    local doc = json.decode(read_file(fs.join(dir, "a.json")))
    assert.equal("prompt", doc.data.source)
    assert.equal(#doc.layers, doc.model.n_layers)
  end)

  it("names the flag, the file and the line for bad input (exit 2, before the model loads)", function()
    local bad = fs.join(dir, "bad.jsonl")
    write(bad, '{"prompt": "ok"}\n{"prompt": 5}\n')
    local noprompts = fs.join(dir, "empty.jsonl")
    write(noprompts, "\n\n")
    local junk = fs.join(dir, "junk.jsonl")
    write(junk, '{"prompt": "ok", "lable": "typo"}\n')
    local out = fs.join(dir, "x.safetensors")
    local cases = {
      { { "--prompts", bad, "--extract-hidden", "1", "--extract-out", out },
        "line 2: field \"prompt\" must be a string" },
      { { "--prompts", noprompts, "--extract-hidden", "1", "--extract-out", out }, "holds no prompts" },
      { { "--prompts", junk, "--extract-hidden", "1", "--extract-out", out }, "line 1: unknown field \"lable\"" },
      { { "--prompts", fs.join(dir, "missing.jsonl"), "--extract-hidden", "1", "--extract-out", out },
        "--prompts: " .. fs.join(dir, "missing.jsonl") .. ": cannot open: No such file" },
      { { "--prompt", "x", "--extract-hidden", "1" }, "--extract-hidden LAYERS and --extract-out FILE go together" },
      { { "--prompt", "x", "--extract-hidden", "1,x", "--extract-out", out },
        "--extract-hidden: expected 'all' or a list of layer numbers" },
      { { "--prompt", "x", "--prompts", bad, "--extract-hidden", "1", "--extract-out", out },
        "exactly one of --prompt TEXT or --prompts" },
      { { "--prompt", "x", "--extract-hidden", "1", "--extract-out", out, "--max-tokens", "3" },
        "--max-tokens does not apply to --extract-hidden" },
      { { "--prompt", "x", "--extract-hidden", "1", "--extract-out", fs.join(dir, "no/such/x.safetensors") },
        "--extract-out: directory" },
      { { "--prompt", "x", "--extract-hidden", "1", "--extract-out", dir }, "is a directory" },
    }
    for _, c in ipairs(cases) do
      local args = { "--model", fs.join(dir, "not-loaded.gguf") }
      for _, a in ipairs(c[1]) do args[#args + 1] = a end
      local code, stdout, err = ember_cli(table.unpack(args))
      assert.equal(2, code, c[2] .. "\n" .. err)
      assert.equal("", stdout)
      assert.matches(c[2], err, 1, true)
    end
  end)

  it("shows a progress line on a terminal and only the summary elsewhere", function()
    local model_path = need_model()
    if not model_path then return end
    local extract, progress = require("ember.analysis.extract"), require("ember.sweep.progress")
    local model = require("ember").load { model = model_path }
    local prompts = { { prompt = "one" }, { prompt = "two" }, { prompt = "three" } }
    local tty, plain = C.sink(), C.sink()
    extract.run(model, prompts, { 1 }, progress.new { mode = "tty", stream = tty, label = "extract", unit = "prompts",
      resumable = false })
    extract.run(model, prompts, { 1 }, progress.new { mode = "summary", stream = plain, label = "extract",
      unit = "prompts", resumable = false })
    model:close()
    -- the terminal: lines rewritten in place (carriage return, erase line), the last one at 3/3
    local t = tty:text()
    assert.matches("\r\27[Kextract: 3/3 prompts (100%)", t, 1, true)
    assert.matches("\r\27%[Kextract: done, 3/3 prompts in [%d.]+s[^\n]*\n$", t)
    -- elsewhere: exactly one line, the summary
    assert.matches("^extract: done, 3/3 prompts in [%d.]+s[^\n]*\n$", plain:text())
  end)

  it("refuses a layer the model does not have", function()
    local model_path = need_model()
    if not model_path then return end
    local code, _, err = ember_cli("--model", model_path, "--prompt", "x", "--extract-hidden", "0,99", "--extract-out",
      fs.join(dir, "x.safetensors"))
    assert.equal(2, code)
    assert.matches("--extract-hidden: layer 99 is out of range", err, 1, true)
    assert.is_false(fs.exists(fs.join(dir, "x.safetensors")))
  end)

  it("refuses an extraction whose sidecar does not match its tensor file", function()
    local model_path = need_model()
    if not model_path then return end
    local out = fs.join(dir, "h.safetensors")
    assert.equal(0, (ember_cli("--model", model_path, "--prompt", "abc", "--extract-hidden", "1", "--extract-out",
      out)))
    local data = read_file(out)
    write(out, data:sub(1, -2) .. string.char((data:byte(-1) + 1) % 256))
    local ok, err = pcall(require("ember.analysis.extract").read, out)
    assert.is_false(ok)
    assert.matches("does not match its sidecar", err, 1, true)
  end)
end)
