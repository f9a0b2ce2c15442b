-- ember.cli.verify — `ember verify DIR`: replays the run a capture artifact's manifest records (its
-- command line, on the model and tokenizer files its sha256s name, with its kernel set, thread
-- count and KV cache type unless --kernels / --threads say otherwise) and checks every tensor, the
-- input ids and the generated ids bit for bit. Must not write anywhere but a scratch directory:
-- every output flag of the recorded command is dropped and the replay captures into the scratch.

local flags = require("ember.cli.flags")
local selectors = require("ember.run.selectors")

local M = {}

local usage_error = flags.usage_error

M.FLAGS_LIST = {
  { "model", "path", "FILE.gguf",
    "the model to replay on (default: the manifest's model.path); its sha256 must match" },
  { "tokenizer", "path", "FILE", "the tokenizer.json (default: the recorded one); its sha256 must match" },
  flags.option("threads", "replay on this many threads (default: the recorded count)"),
  flags.option("kernels", "replay on this kernel set (default: the recorded one)"),
  flags.option("help"),
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.usage({ "usage: ember verify DIR [--kernels SET] [--threads N] [--model FILE.gguf] [--tokenizer FILE]",
    "", "options:" }, M.FLAGS_LIST, { "",
      "Replays the run the capture artifact DIR records and compares every tensor bit for bit; exit 0 when",
      "all are identical, 1 when one differs (the first difference is named). See docs/artifacts.md." })
end

local function fail(msg, ...) error("verify: " .. string.format(msg, ...), 0) end

-- The flags of the recorded command a replay never passes on: its outputs (replaced by the
-- scratch capture) and what the replay sets itself.
local DROPPED = { ["activation-stats"] = true, ["capture-activations"] = true, ["run-manifest"] = true,
  trace = true, ["dump-layers"] = true, ["dump-logits"] = true, ["extract-out"] = true, model = true,
  tokenizer = true, kernels = true, threads = true, ["kv-cache"] = true }

-- recorded(m, where) -> the recorded command's arguments (after "ember") and the values of its
-- flags by name; raises naming what the manifest lacks for a replay
local function recorded(m, where)
  local missing = {}
  for _, k in ipairs({ "model.sha256", "model.path", "execution.kernels", "execution.threads", "input_ids", "argv" }) do
    local v = m
    for part in k:gmatch("[^.]+") do v = type(v) == "table" and v[part] or nil end
    if v == nil or v == require("ember.store.json").null then missing[#missing + 1] = k end
  end
  if #missing > 0 then fail("%s: the manifest does not record enough to replay the run (no %s)", where,
    table.concat(missing, ", ")) end
  local argv = m.argv
  if argv[1] ~= "ember" or (argv[2] and not tostring(argv[2]):match("^%-")) then
    fail("%s: the manifest's argv ('%s') is not an ember generation command, which is what verify replays", where,
      table.concat(argv, " "):sub(1, 120))
  end
  local spec = flags.spec(require("ember.cli").FLAGS)
  local keep, values, i = {}, {}, 2
  while i <= #argv do
    local a = tostring(argv[i])
    local name, value = selectors.parse_flag(a)
    local f = name and spec[name]
    if f and value == nil and f.kind ~= "bool" then value = argv[i + 1]; i = i + 1 end
    if name then values[name] = value end
    if not (name and DROPPED[name]) then
      keep[#keep + 1] = a
      if f and value ~= nil and not a:find("=", 1, true) then keep[#keep + 1] = value end
    end
    i = i + 1
  end
  return keep, values
end

-- checked_file(path, sha, what, where) -> path, once the file exists and has the recorded sha256
local function checked_file(path, sha, what, where)
  local fs = require("ember.store.fs")
  if not fs.exists(path) then fail("%s: the %s file '%s' does not exist (give --%s PATH)", where, what, path, what) end
  local got = require("ember.store.manifest").file_sha256(path)
  if got ~= sha then
    fail("%s: sha256 mismatch: the %s file '%s' is %s, the artifact was computed from %s", where, what, path, got, sha)
  end
  return path
end

-- plan(dir, o, scratch) -> the replay's arguments and what it runs on
local function plan(dir, m, o, scratch)
  local where = "'" .. dir .. "'"
  local keep, values = recorded(m, where)
  local model = checked_file(o.model or values.model or m.model.path, m.model.sha256, "model", where)
  local args = { "--model", model }
  if type(m.tokenizer) == "table" and m.tokenizer.source == "file" then
    local tok = o.tokenizer or values.tokenizer or m.tokenizer.path
    args[#args + 1], args[#args + 2] = "--tokenizer", checked_file(tok, m.tokenizer.sha256, "tokenizer", where)
  end
  local run = { kernels = o.kernels or m.execution.kernels, threads = o.threads or m.execution.threads,
    kv = m.execution.kv_cache or "f32" }
  for _, a in ipairs(keep) do args[#args + 1] = a end
  for _, kv in ipairs({ { "--kernels", run.kernels }, { "--threads", run.threads }, { "--kv-cache", run.kv },
    { "--capture-activations", scratch } }) do
    args[#args + 1], args[#args + 2] = kv[1], tostring(kv[2])
  end
  return args, run
end

-- first_difference(a, b) -> the 0-based index of the first differing f32 of two equal-length byte strings
local function first_difference(a, b)
  local lo = 1
  while lo <= #a do -- whole blocks first, then floats
    local hi = math.min(lo + 4095, #a)
    if a:sub(lo, hi) ~= b:sub(lo, hi) then break end
    lo = hi + 1
  end
  for k = lo, #a, 4 do
    if a:sub(k, k + 3) ~= b:sub(k, k + 3) then return (k - 1) // 4 end
  end
  return nil
end

local function show(bytes)
  local v = string.unpack("<f", bytes)
  return string.format("%.9g (0x%08x)", v, string.unpack("<I4", bytes))
end

local function first_id_difference(a, b)
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then return i - 1 end
  end
  return nil
end

-- compare(old, new) -> lines, identical: ids, the record set, then every tensor's bytes
local function compare(old, new)
  local artifact = require("ember.store.artifact")
  local lines, same = {}, true
  for _, k in ipairs({ "input_ids", "generated_ids" }) do
    local a, b = old.manifest[k] or {}, new.manifest[k] or {}
    local d = first_id_difference(a, b)
    if d then
      same = false
      lines[#lines + 1] = string.format("  %s differ at index %d: recorded %s, replayed %s", k, d, tostring(a[d + 1]),
        tostring(b[d + 1]))
    else
      lines[#lines + 1] = string.format("  %s: %d ids, identical", k, #a)
    end
  end
  local ra, rb = old.records, new.records
  if #ra ~= #rb then
    same = false
    lines[#lines + 1] = string.format("  records: %d recorded, %d replayed", #ra, #rb)
  end
  local differing, values, first = 0, 0, nil
  for i = 1, math.min(#ra, #rb) do
    local a, b = ra[i], rb[i]
    if artifact.record_label(a) ~= artifact.record_label(b) then
      same = false
      lines[#lines + 1] = string.format("  record %d is %s recorded, %s replayed", i - 1, artifact.record_label(a),
        artifact.record_label(b))
      break
    end
    local ba, bb = a.tensor:bytes(), b.tensor:bytes()
    values = values + #ba // 4
    if ba ~= bb then
      differing = differing + 1
      if not first then
        local k = first_difference(ba, bb)
        local cols = a.shape[2]
        first = string.format("  first difference: record %d (%s), row %d, column %d: recorded %s, replayed %s", i - 1,
          artifact.record_label(a), k // cols, k % cols, show(ba:sub(4 * k + 1, 4 * k + 4)),
          show(bb:sub(4 * k + 1, 4 * k + 4)))
      end
    end
  end
  lines[#lines + 1] = string.format("  tensors: %d records compared (%d values), %d differing", math.min(#ra, #rb),
    values, differing)
  if first then lines[#lines + 1] = first end
  return lines, same and differing == 0
end

-- main(args, argv, io_) -> exit code; args[1] is "verify"
function M.main(args, _, io_)
  local o, pos = flags.command({ name = "verify", spec = M.FLAGS, usage = M.usage, positionals = true }, args, io_)
  if not o then return 0 end
  if #pos ~= 1 then usage_error("verify: one artifact directory, got %d arguments", #pos) end
  local fs, artifact = require("ember.store.fs"), require("ember.store.artifact")
  local old = artifact.read(pos[1])
  local scratch = fs.make_temp_dir("ember-verify")
  local ok, res = pcall(function()
    local replay_args, run = plan(pos[1], old.manifest, o, fs.join(scratch, "replay"))
    -- the replay's own output (its generated text, its notices) is kept, shown only when it fails
    local out, err = { parts = {} }, { parts = {} }
    local function writer(t) return { write = function(self, ...)
      for _, s in ipairs({ ... }) do t.parts[#t.parts + 1] = tostring(s) end
      return self
    end, flush = function() end } end
    local code = require("ember.cli").main(replay_args, { stdout = writer(out), stderr = writer(err) })
    if code ~= 0 then fail("the replay failed (exit %d): %s", code, table.concat(err.parts):sub(1, 2000)) end
    local lines, same = compare(old, artifact.read(fs.join(scratch, "replay")))
    local shown = {}
    for i, a in ipairs(replay_args) do shown[i] = a:match("^[%w%-%._/=:,@+]+$") and a or fs.shell_quote(a) end
    table.insert(lines, 1, string.format("verify: '%s' replayed on kernels %s, %s thread(s), KV %s: ember %s", pos[1],
      run.kernels, tostring(run.threads), run.kv, table.concat(shown, " ")))
    lines[#lines + 1] = "result: " .. (same and "IDENTICAL (every tensor bit-identical)" or "DIFFERENT")
    return { lines = lines, same = same }
  end)
  fs.remove_tree(scratch)
  if not ok then error(res, 0) end
  io_.stdout:write(table.concat(res.lines, "\n"), "\n")
  return res.same and 0 or 1
end

return M
