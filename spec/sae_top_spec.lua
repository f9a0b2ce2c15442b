-- ember sae top / ember.sae.top: the top-activating examples against plain loops over the features
-- of each prompt (taken from separate runs: the residual through run_with_cache, encoded by the
-- SAE); two shards merged equal the unsharded run; an interrupted run resumes to the same result;
-- a job array through scripts/slurm/sweep_array.sh --command "sae top" equals one run;
-- the command writes JSON, safetensors and the feature cards (text and picture).

local ember = require("ember")
local cjson = require("cjson")
local cases = require("helpers.sae_cases")
local C = require("helpers.cli")
local H = require("helpers.artifacts")
local files = require("helpers.files")

local PROMPTS = { "The quick brown fox", "jumps over the lazy dog", "and then some more words", "a b c d e f" }
local FEATURES = { 0, 3, 5, 7, 11, 200 }
local LAYER = 1

local function prompts_of(model)
  local out = {}
  for i, p in ipairs(PROMPTS) do out[i] = { text = p, ids = model:tokenize(p) } end
  return out
end

-- For each feature, every prompt's (max, first position of it), ranked as the module promises.
local function expected(model, sae, prompts, top)
  local want = {}
  for k, feat in ipairs(FEATURES) do
    local list = {}
    for i, p in ipairs(prompts) do
      local x = model:run_with_cache { ids = p.ids, stages = { "after_layer" }, layers = { LAYER } }.after_layer[LAYER]
      local f = sae:encode(x)
      local best, at = 0, nil
      for r = 1, #p.ids do
        local v = f:get(r, feat + 1)
        if v > best then best, at = v, r - 1 end
      end
      if at then list[#list + 1] = { prompt = i - 1, position = at, activation = best } end
    end
    table.sort(list, function(a, b)
      if a.activation ~= b.activation then return a.activation > b.activation end
      return a.prompt < b.prompt
    end)
    want[k] = { table.unpack(list, 1, math.min(top, #list)) }
  end
  return want
end

local function strip(features)
  local out = {}
  for k, f in ipairs(features) do
    out[k] = {}
    for i, ex in ipairs(f.examples) do
      out[k][i] = { prompt = ex.prompt, position = ex.position, activation = ex.activation }
    end
  end
  return out
end

describe("ember.sae.top", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  local function setup_model()
    local path = C.need_model()
    if not path then return end
    local model = ember.load { model = path }
    local e = cases.copy("saelens_standard_v6")
    return model, ember.sae.load(e.sae, { model = model })
  end

  it("keeps, per feature, the prompts where it fires most with their top positions and windows", function()
    local model, sae = setup_model()
    if not model then return end
    local prompts = prompts_of(model)
    local res = require("ember.sae.top").run { model = model, sae = sae, prompts = prompts, features = FEATURES,
      top = 3, before = 2, after = 1 }
    assert.are.equal("complete", res.status)
    assert.are.same(expected(model, sae, prompts, 3), strip(res.features))
    local ex = res.features[1].examples[1]
    assert.is_not_nil(ex)
    local ids = prompts[ex.prompt + 1].ids
    assert.are.equal(math.max(0, ex.position - 2), ex.first)
    assert.are.equal(ex.activation, ex.activations[ex.position - ex.first + 1])
    for j, id in ipairs(ex.ids) do assert.are.equal(ids[ex.first + j], id) end
    assert.are.equal(model:detokenize({ ex.ids[1] }), ex.tokens[1])
  end)

  it("gives the same result from two merged shards and from an interrupted run resumed", function()
    local model, sae = setup_model()
    if not model then return end
    local top = require("ember.sae.top")
    local prompts = prompts_of(model)
    local base = { model = model, sae = sae, prompts = prompts, features = FEATURES, top = 2 }
    local function with(t)
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      for k, v in pairs(t) do o[k] = v end
      return o
    end
    local whole = H.tmpdir()
    top.run(with { out = whole })
    local a, b, merged = H.tmpdir(), H.tmpdir(), H.tmpdir()
    assert.are.equal("complete", top.run(with { out = a, shard = "0/2" }).status) -- (its own prompts)
    top.run(with { out = b, shard = "1/2" })
    local doc = top.merge(merged, { a, b })
    assert.are.equal("complete", doc.status)
    local want = cjson.decode(files.read(whole .. "/top.json"))
    assert.are.same(want.features, doc.features)
    assert.are.equal(files.read(whole .. "/top.safetensors"), files.read(merged .. "/top.safetensors"))
    -- a run stopped after two prompts keeps them, and the rerun computes only the rest
    local stopped = H.tmpdir()
    local steps = 0
    local stop = { start = function() end, finish = function() end,
      step = function() steps = steps + 1; if steps == 2 then error("stop here") end end }
    assert.has_error(function() top.run(with { out = stopped, progress = stop }) end, "stop here")
    local again = top.run(with { out = stopped })
    assert.are.same({ total = 4, resumed = 2, computed = 2 }, again.stats)
    assert.are.same(want.features, cjson.decode(files.read(stopped .. "/top.json")).features)
    -- another run's directory is not resumed
    assert.has_error(function() top.run(with { out = stopped, top = 3 }) end)
  end)
end)

describe("ember sae top", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("writes the examples as JSON and safetensors, and a card per feature", function()
    local path = C.need_model()
    if not path then return end
    local e = cases.copy("saelens_standard_v6")
    local dir = H.tmpdir()
    local lines = {}
    for i, p in ipairs(PROMPTS) do lines[i] = cjson.encode({ prompt = p }) end
    H.write(dir .. "/p.jsonl", table.concat(lines, "\n") .. "\n")
    local code, out, err = C.ember("sae", "top", "--model", path, "--sae", e.sae, "--prompts", dir .. "/p.jsonl",
      "--features", "0-3", "--top", "3", "--out", dir .. "/top", "--progress", "none")
    assert.are.equal(0, code, err)
    assert.matches("feature 0 of .*: fires on %d+ of %d+ tokens", out)
    local doc = cjson.decode(files.read(dir .. "/top/top.json"))
    assert.are.same({ 0, 1, 2, 3 }, doc.settings.features)
    assert.are.equal("complete", doc.status)
    local st = require("ember.store.safetensors").decode(files.read(dir .. "/top/top.safetensors"))
    assert.are.same({ 4, 3 }, st.tensors.values.shape)
    assert.are.same({ 12, 13 }, st.tensors.windows.shape)
    for f = 0, 3 do
      assert.is_true(#files.read(dir .. "/top/cards/feature-" .. f .. ".txt") > 0)
      if #doc.features[f + 1].examples > 0 and require("ember.analysis.plot").gnuplot() then
        assert.is_true(#files.read(dir .. "/top/cards/feature-" .. f .. ".svg") > 0)
      end
    end
    code, out = C.ember("sae", "top", "merge", dir .. "/m", dir .. "/top")
    assert.are.equal(0, code)
    assert.matches("complete, 4 of 4 prompts", out)
  end)

  -- An sbatch stand-in runs the submitted array's tasks here, one after the other, with their
  -- SLURM_ARRAY_TASK_ID, and the merge job after them: the scripts sweep_array.sh writes for
  -- --command "sae top" are what runs (spec/slurm_spec.lua runs a real cluster for sweeps).
  local FAKE_SBATCH = [[#!/bin/sh
array=
while [ $# -gt 0 ]; do
  case $1 in --array=*) array=${1#--array=}; shift ;; --*) shift ;; *) break ;; esac
done
script=$1; shift
if [ -n "$array" ]; then
  i=0; last=${array#*-}
  while [ $i -le "$last" ]; do SLURM_ARRAY_TASK_ID=$i "$script" "$@" >/dev/null || exit 1; i=$((i + 1)); done
  echo 4242
else
  "$script" "$@" >/dev/null || exit 1
  echo 4243
fi
]]

  it("runs as a Slurm job array (sweep_array.sh --command 'sae top'), merged equal to one run", function()
    local path = C.need_model()
    if not path then return end
    local launcher = (os.getenv("EMBER_BUILD") or "build") .. "/ember"
    if not io.open(launcher, "rb") then return pending("missing " .. launcher) end
    local e = cases.copy("saelens_standard_v6")
    local dir = H.tmpdir()
    local lines = {}
    for i, p in ipairs(PROMPTS) do lines[i] = cjson.encode({ prompt = p }) end
    H.write(dir .. "/p.jsonl", table.concat(lines, "\n") .. "\n")
    assert(os.execute("mkdir " .. H.shell_quote(dir .. "/bin")))
    H.write(dir .. "/bin/sbatch", FAKE_SBATCH)
    assert(os.execute("chmod +x " .. H.shell_quote(dir .. "/bin/sbatch")))
    local flags = { "--model", path, "--sae", e.sae, "--prompts", dir .. "/p.jsonl", "--features", "0-7", "--top", "2" }
    local code, _, err = C.ember("sae", "top", "--out", dir .. "/one", "--progress", "none", table.unpack(flags))
    assert.are.equal(0, code, err)
    local q = {}
    for i, f in ipairs(flags) do q[i] = H.shell_quote(f) end
    local abs = io.popen("cd " .. H.shell_quote(launcher:match("^(.*)/")) .. " && pwd"):read("l") .. "/ember"
    local ok = os.execute(string.format("PATH=%s:$PATH EMBER=%s scripts/slurm/sweep_array.sh --command 'sae top' "
      .. "--shards 3 --out %s -- %s >%s 2>&1", H.shell_quote(dir .. "/bin"), H.shell_quote(abs),
      H.shell_quote(dir .. "/arr"), table.concat(q, " "), H.shell_quote(dir .. "/log")))
    assert.is_true(ok == true, files.read(dir .. "/log"))
    local one = cjson.decode(files.read(dir .. "/one/top.json"))
    local arr = cjson.decode(files.read(dir .. "/arr/top.json"))
    assert.are.equal("complete", arr.status)
    assert.are.same({ 0, 1, 2, 3 }, arr.prompts_done)
    assert.are.same(strip(one.features), strip(arr.features))
    for s = 0, 2 do assert.is_true(files.read(dir .. "/arr.shards/" .. s .. "/top.json") ~= nil) end
  end)
end)
