-- helpers.artifacts — crafted activation artifacts for the artifact/compare specs: f32 packing,
-- a complete set of provenance sections, scratch directories, and a sha256 oracle that is not
-- ember's (the system's sha256sum), so the specs do not check ember with ember.

local M = {}

local shell_quote = require("ember.store.fs").shell_quote
M.shell_quote = shell_quote

-- f32{...} -> little-endian float32 bytes
function M.f32(values)
  return string.pack("<" .. string.rep("f", #values), table.unpack(values))
end

function M.unpack_f32(bytes)
  local n = #bytes // 4
  local out = { string.unpack("<" .. string.rep("f", n), bytes) }
  out[n + 1] = nil -- string.unpack also returns the position after the last value
  return out
end

-- sha256 of a string by the coreutils tool, or nil when it is not installed.
function M.sha256sum(data)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
  local p = io.popen("sha256sum " .. shell_quote(path) .. " 2>/dev/null")
  local out = p and p:read("a") or ""
  if p then p:close() end
  os.remove(path)
  return out:match("^(%x+)")
end

-- A fresh empty directory; every one is removed by cleanup().
local dirs = {}
function M.tmpdir()
  local path = os.tmpname()
  os.remove(path)
  assert(os.execute("mkdir " .. shell_quote(path)))
  dirs[#dirs + 1] = path
  return path
end

function M.cleanup()
  for _, d in ipairs(dirs) do os.execute("rm -rf " .. shell_quote(d)) end
  dirs = {}
end

M.read = require("helpers.files").read

function M.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

function M.listdir(dir)
  local p = io.popen("ls -1A " .. shell_quote(dir))
  local names = {}
  for line in p:lines() do names[#names + 1] = line end
  p:close()
  table.sort(names)
  return names
end

-- The provenance of a pretend run; `patch` (a function) may change any field before use.
function M.sections(patch)
  local s = {
    created_at_unix = 1700000000,
    tool = { name = "ember", version = "0.0.0-spec" },
    model = { path = "/models/m.gguf", sha256 = string.rep("a", 64), family = "llama", n_layers = 2,
      hidden_size = 3, n_vocab = 4 },
    tokenizer = { source = "gguf", sha256 = string.rep("a", 64) },
    -- sha256 of "hi" (sha256sum): the reader checks that a kept text is the one its digest names
    prompt = { sha256 = "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4", source = "text",
      text = "hi", withheld = false, token_count = 2 },
    input_ids = { 1, 2 },
    generated_ids = { 3, 1 },
    settings = { max_tokens = 2, temperature = 0.0, top_k = 0, top_p = 1.0, seed = 0 },
    execution = { kernels = "reference", threads = 1 },
    experiment = { name = "capture", args = "", modified = false, members = {} },
    capture = { config = { stages = { "after_mlp", "after_logits" } }, config_sha256 = string.rep("d", 64),
      output_dir = "/tmp/a", record_count = 4, dropped_records = 0 },
    argv = { "ember", "--capture-activations", "/tmp/a" },
  }
  if patch then patch(s) end
  return s
end

-- The records of a pretend 2-layer, hidden-3, vocab-4 run with a 2-token prompt and one decode.
-- `values` may override a record's values by its index (1-based).
function M.records(values)
  local recs = {
    { stage = "after_mlp", layer = 1, phase = "prefill", start_position = 0, shape = { 2, 3 },
      v = { 0.5, -1.0, 2.0, 0.25, 0.0, -3.5 } },
    { stage = "after_logits", phase = "prefill", start_position = 0, shape = { 1, 4 }, v = { 0.1, 2.5, -1.0, 0.3 } },
    { stage = "after_mlp", layer = 1, phase = "decode", start_position = 2, shape = { 1, 3 }, v = { 1.0, 1.5, -0.5 } },
    { stage = "after_logits", phase = "decode", start_position = 2, shape = { 1, 4 }, v = { 3.0, 0.0, 0.5, -2.0 } },
  }
  for i, r in ipairs(recs) do
    r.data = M.f32((values and values[i]) or r.v)
    r.v = nil
  end
  return recs
end

return M
