-- A real Slurm run: a single-node cluster (munged, slurmctld, slurmd) in a temporary directory,
-- a 4-task job-array sweep submitted with the shipped launcher, merged, and required to be
-- bit-identical to the same sweep run in one local process; a sweep over pairs and quant-recipe's
-- first pass the same way. Pending, with the reason, when the
-- cluster cannot start here (not root, Slurm or MUNGE missing); every daemon started is stopped.

local fs = require("ember.store.fs")
local store = require("ember.sweep.store")
local merge = require("ember.sweep.merge")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")

local CLEAN, CORRUPTED = "The quick brown cat", "The slow brown fox"

local function read(path) return require("helpers.files").read_if_exists(path) or "" end

-- sh(cmd) -> exit code (os.execute's status, or 128 + signal)
local function sh(cmd)
  local ok, how, code = os.execute(cmd)
  if ok then return 0 end
  return how == "exit" and code or 128 + code
end

local q = fs.shell_quote

-- with_cluster(body): body(work, cluster, abs_launcher) with a single-node cluster started in a
-- temporary directory (pending, with the reason, when it cannot start here), stopped afterwards
local function with_cluster(body)
  local launcher = fx.build .. "/ember"
  if not fx.exists(launcher) then pending("missing " .. launcher); return end
  local work = fs.make_temp_dir("ember-slurm-spec")
  -- make_temp_dir's directories are private (0700); munged, running as munge, must get in
  assert(os.execute("chmod 755 " .. q(work)))
  local cluster = work .. "/cluster"
  local started = false
  finally(function()
    if started then sh("scripts/slurm/local_cluster.sh stop " .. q(cluster) .. " >/dev/null 2>&1") end
    fs.remove_tree(work)
  end)
  local log = work .. "/start.log"
  local code = sh("scripts/slurm/local_cluster.sh start " .. q(cluster) .. " >" .. q(log) .. " 2>&1")
  started = fs.exists(cluster .. "/slurm.conf")
  if code == 77 then
    local text = read(log)
    pending("Slurm cannot start here: " .. (text:match("cannot start a cluster here: ([^\n]*)") or text))
    return
  end
  assert.equal(0, code, "local_cluster.sh start failed:\n" .. read(log))
  body(work, cluster, io.popen("cd " .. q(fs.dirname(launcher)) .. " && pwd"):read("l") .. "/ember")
end

describe("Slurm job-array sweep", function()
  it("runs 4 shards on a real single-node cluster, merged bit-identical to the local grid", function()
    local model, why = fx.tiny_model("--family llama --dtype f32 --layers 2 --seed 7")
    if not model then pending("tiny model unavailable: " .. tostring(why)); return end
    with_cluster(function(work, cluster, abs)
      local code
      -- the local reference grid
      local here = work .. "/local"
      local rc, _, err = C.ember("sweep", "--model", model, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out", here,
        "--threads", "1", "--progress", "none", "--no-plot")
      assert.equal(0, rc, err)

      local out = work .. "/slurm"
      local cmd = string.format("SLURM_CONF=%s EMBER=%s timeout 180 scripts/slurm/sweep_array.sh --shards 4 --out %s "
        .. "--wait -- --model %s --clean %s --corrupted %s --threads 1 >%s 2>&1", q(cluster .. "/slurm.conf"), q(abs),
        q(out), q(model), q(CLEAN), q(CORRUPTED), q(work .. "/launch.log"))
      code = sh(cmd)
      local logs = read(work .. "/launch.log")
      for i = 0, 3 do logs = logs .. read(string.format("%s.shards/slurm-1_%d.log", out, i)) end
      assert.equal(0, code, "sweep_array.sh failed:\n" .. logs .. read(cluster .. "/slurmctld.log"):sub(-2000))
      assert.matches("submitted array job %d+ %(4 tasks%)", logs)

      -- 4 shards, each computed by its own array task, merged into one complete grid
      local m = store.read(out)
      assert.equal("complete", m.manifest.status)
      assert.equal(4, #m.manifest.merged_from)
      for i = 0, 3 do
        local s = store.read(string.format("%s.shards/%d", out, i))
        assert.equal(i, s.manifest.shard.index)
        assert.equal(4, s.manifest.shard.count)
      end
      local res = merge.compare(store.read(here), m)
      assert.is_true(res.equal, merge.format(res, store.read(here), m))
      assert.equal(24, res.compared)
      assert.equal(read(here .. "/grid.safetensors"), read(out .. "/grid.safetensors"))
    end)
  end)

  it("runs a sweep over a dataset of pairs (--pairs) as 2 array tasks, merged bit-identical to one run", function()
    local model, why = fx.tiny_model("--family llama --dtype f32 --layers 2 --seed 7")
    if not model then pending("tiny model unavailable: " .. tostring(why)); return end
    with_cluster(function(work, cluster, abs)
      local pairs = work .. "/pairs.jsonl"
      local f = assert(io.open(pairs, "w")) -- token ids: the same length in every pair
      f:write('{"clean": [1, 5, 9, 20, 33], "corrupted": [1, 5, 12, 20, 40], "answer": 7, "wrong": 11}\n',
        '{"clean": [1, 8, 9, 21, 33], "corrupted": [1, 8, 14, 21, 41], "answer": 7, "wrong": 11}\n')
      f:close()
      local here = work .. "/local"
      local rc, _, err = C.ember("sweep", "--model", model, "--pairs", pairs, "--out", here, "--threads", "1",
        "--progress", "none", "--no-plot")
      assert.equal(0, rc, err)
      local out = work .. "/slurm"
      local code = sh(string.format("SLURM_CONF=%s EMBER=%s timeout 180 scripts/slurm/sweep_array.sh --shards 2 "
        .. "--out %s --wait -- --model %s --pairs %s --threads 1 >%s 2>&1", q(cluster .. "/slurm.conf"), q(abs), q(out),
        q(model), q(pairs), q(work .. "/launch.log")))
      local logs = read(work .. "/launch.log")
      for i = 0, 1 do logs = logs .. read(string.format("%s.shards/slurm-1_%d.log", out, i)) end
      assert.equal(0, code, "sweep_array.sh failed:\n" .. logs .. read(cluster .. "/slurmctld.log"):sub(-2000))
      local m = store.read(out)
      assert.equal("complete", m.manifest.status)
      assert.equal(2, m.manifest.pairs.count)
      local res = merge.compare(store.read(here), m)
      assert.is_true(res.equal, merge.format(res, store.read(here), m))
      assert.equal(read(here .. "/grid.safetensors"), read(out .. "/grid.safetensors"))
    end)
  end)

  it("runs quant-recipe's first pass as 3 array tasks, merged into the recipe of one local run", function()
    local a = fx.tiny_model("--family llama --dtype f32 --layers 3 --seed 7")
    local b = fx.tiny_model("--family llama --dtype q4_0 --layers 3 --seed 7")
    if not a or not b then pending("tiny models unavailable"); return end
    with_cluster(function(work, cluster, abs)
      local prompts = work .. "/p.jsonl"
      local f = assert(io.open(prompts, "w"))
      f:write('{"prompt": "The quick brown fox"}\n{"prompt": "jumps over the lazy dog"}\n')
      f:close()
      local flags = { "--reference", a, "--quantized", b, "--prompts", prompts, "--no-verify", "--no-plot",
        "--threads", "1" }
      local rc, _, err = C.ember("quant-recipe", "--out", work .. "/local", table.unpack(flags))
      assert.equal(0, rc, err)
      local words = {}
      for i, w in ipairs(flags) do words[i] = q(w) end
      local out = work .. "/slurm"
      local code = sh(string.format("SLURM_CONF=%s EMBER=%s timeout 180 scripts/slurm/sweep_array.sh --command "
        .. "quant-recipe --shards 3 --out %s --wait -- %s >%s 2>&1", q(cluster .. "/slurm.conf"), q(abs), q(out),
        table.concat(words, " "), q(work .. "/launch.log")))
      local logs = read(work .. "/launch.log")
      for i = 0, 2 do logs = logs .. read(string.format("%s.shards/slurm-1_%d.log", out, i)) end
      assert.equal(0, code, "sweep_array.sh failed:\n" .. logs .. read(cluster .. "/slurmctld.log"):sub(-2000))
      local cjson = require("cjson")
      local here, there = cjson.decode(read(work .. "/local/report.json")), cjson.decode(read(out .. "/report.json"))
      assert.are.same(here.groups, there.groups)
      assert.are.same(here.selection, there.selection)
      assert.equal(0, there.timing.first_pass_measured) -- every group measured by an array task
      assert.equal(read(work .. "/local/tensor-types.txt"), read(out .. "/tensor-types.txt"))
      for i = 0, 2 do
        local shard = cjson.decode(read(string.format("%s.shards/%d/first-pass.json", out, i)))
        assert.are.same({ index = i, count = 3 }, shard.shard)
      end
    end)
  end)
end)

teardown(function() fx.cleanup() end)
