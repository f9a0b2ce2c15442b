-- scripts/slurm/sweep_array.sh with hostile paths: spaces, `$(...)`, backticks, both quotes and
-- newlines in --out and in EMBER. A stand-in sbatch records each submission's arguments
-- (NUL-separated) and the recorded task and merge scripts are then run as Slurm would run them,
-- with a stand-in ember that records what it was given: every path must arrive as it was written,
-- and nothing in it may run (no file appears).

local fs = require("ember.store.fs")
local H = require("helpers.artifacts")

local q = fs.shell_quote

local function script(path, text)
  H.write(path, text)
  assert(os.execute("chmod +x " .. q(path)))
end

-- the NUL-separated records of a file -> list of strings
local function records(path)
  local out = {}
  for rec in (require("helpers.files").read(path)):gmatch("([^%z]*)%z") do out[#out + 1] = rec end
  return out
end

describe("sweep_array.sh", function()
  after_each(H.cleanup)

  it("passes hostile paths through to the tasks and the merge as they are, running nothing", function()
    local work = H.tmpdir()
    local hostile = work .. "/res $(touch PWNED1) `touch PWNED2` 'q' \"d\" $HOME\nline2"
    local bin = work .. "/bin dir $(touch PWNED3)"
    assert(os.execute("mkdir -p " .. q(bin)))
    -- sbatch: prints a job id, appends its arguments to calls (one record per argument, a blank record
    -- after each call)
    script(bin .. "/sbatch", "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done >> \"$CALLS\"\n"
      .. "printf '\\0' >> \"$CALLS\"\necho 4242\n")
    -- ember: records its arguments
    local ember = bin .. "/ember `touch PWNED4`"
    script(ember, "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done >> \"$RAN\"\nprintf '\\0' >> \"$RAN\"\n")
    local calls, ran = work .. "/calls", work .. "/ran"
    local env = string.format("cd %s && PATH=%s:$PATH CALLS=%s RAN=%s EMBER=%s", q(work), q(bin), q(calls), q(ran),
      q(ember))
    local launch = string.format("%s sh %s/scripts/slurm/sweep_array.sh --shards 2 --out %s -- --model 'm $(x).gguf'"
      .. " --clean a --corrupted b >/dev/null 2>&1", env, q(os.getenv("PWD")), q(hostile))
    assert.is_true(os.execute(launch))
    local base = hostile .. ".shards"
    -- the two submissions: the array (task.sh EMBER SHARDS BASE FLAGS...) and the merge
    local rec = records(calls)
    local subs, cur = {}, {}
    for _, a in ipairs(rec) do
      if a == "" then subs[#subs + 1] = cur; cur = {} else cur[#cur + 1] = a end
    end
    assert.equal(2, #subs)
    -- run each submitted script with its arguments as Slurm would (the array task for index 1)
    for i, sub in ipairs(subs) do
      local at
      for j, a in ipairs(sub) do if not at and a:match("%.sh$") and a:sub(1, 1) == "/" then at = j end end
      assert.is_truthy(at, table.concat(sub, " | "))
      local argv = { "sh" }
      for j = at, #sub do argv[#argv + 1] = q(sub[j]) end
      local cmd = string.format("cd %s && RAN=%s SLURM_ARRAY_TASK_ID=1 %s", q(work), q(ran), table.concat(argv, " "))
      assert.is_true(os.execute(cmd), "submission " .. i)
    end
    local got = records(ran)
    local task = { "sweep", "--model", "m $(x).gguf", "--clean", "a", "--corrupted", "b", "--shard", "1/2", "--out",
      base .. "/1", "--progress", "summary", "" }
    local merge = { "sweep", "merge", hostile, base .. "/0", base .. "/1", "" }
    local want = {}
    for _, a in ipairs(task) do want[#want + 1] = a end
    for _, a in ipairs(merge) do want[#want + 1] = a end
    assert.same(want, got)
    for i = 1, 4 do
      assert.is_false(fs.exists(work .. "/PWNED" .. i), "PWNED" .. i .. " was made: a path ran as a command")
    end
  end)
end)
