-- `ember quant-recipe` on tiny models: A = f32, B = q4_0 of the same generated weights (with layer
-- 2's MLP written in f32 in B too, so that group is identical in A and B). The first pass's shares
-- against a measurement of this spec's own (the written file with the group in f32, its own softmax
-- and KL), the certified group, the recipe file, determinism, bad input, the round trip through
-- llama-quantize when it is at hand, and the first pass sharded (--shard, merge, --jobs) and resumed
-- against one plain run.

local ember = require("ember")
local H = require("helpers.artifacts")
local cli = require("helpers.cli")
local json = require("ember.store.json")

local SEED = 7
local PROMPTS = { "The quick brown fox", "jumps over the lazy dog", "A tiny model of", "hello there, world",
  "one two three four", "the cat sat on the mat", "what is the answer", "numbers 1 2 3" }
local SAME = { "blk.2.ffn_gate.weight=f32", "blk.2.ffn_up.weight=f32", "blk.2.ffn_down.weight=f32" }

local function tiny(dir, name, dtype, tensor_types, family)
  local path = dir .. "/" .. name .. ".gguf"
  assert(ember.make_tiny_model(path, { family = family or "llama", dtype = dtype, seed = SEED,
    tensor_types = tensor_types }))
  return path
end

local function write_prompts(path, list)
  local f = assert(io.open(path, "w"))
  for _, p in ipairs(list) do f:write(json.encode({ prompt = p }), "\n") end
  f:close()
  return path
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- KL(p || q) of two logits rows, in double, this spec's own
local function kl_rows(la, lb)
  local function probs(v)
    local mx = -math.huge
    for i = 1, #v do mx = math.max(mx, v[i]) end
    local s, p = 0, {}
    for i = 1, #v do p[i] = math.exp(v[i] - mx); s = s + p[i] end
    for i = 1, #v do p[i] = p[i] / s end
    return p
  end
  local p, q, d = probs(la), probs(lb), 0
  for i = 1, #p do if p[i] > 0 then d = d + p[i] * math.log(p[i] / q[i]) end end
  return d
end

local function mean_kl(ref, path)
  local a, m = ember.load(ref), ember.load(path)
  local sum = 0
  for _, text in ipairs(PROMPTS) do
    local ids = a:tokenize(text)
    local sa, sm = a:session(), m:session()
    sum = sum + kl_rows(sa:prefill(ids):values(), sm:prefill(ids):values())
    sa:close()
    sm:close()
  end
  a:close()
  m:close()
  return sum / #PROMPTS
end

local function group(report, name)
  for _, g in ipairs(report.groups) do if g.name == name then return g end end
end

describe("ember quant-recipe", function()
  local dir, a, b, prompts
  before_each(function()
    dir = H.tmpdir()
    a, b = tiny(dir, "a", "f32"), tiny(dir, "b", "q4_0", SAME)
    prompts = write_prompts(dir .. "/prompts.jsonl", PROMPTS)
  end)
  after_each(H.cleanup)

  local function run(out, ...)
    return cli.ember("quant-recipe", "--reference", a, "--quantized", b, "--prompts", prompts, "--out", out, ...)
  end

  it("measures each group's recovered share, certifies an identical group 0, writes the recipe", function()
    local out = dir .. "/r"
    local code, stdout, stderr = run(out, "--no-verify", "--no-plot", "--target", "0.95")
    assert.equal(0, code, stderr)
    assert.matches("first pass", stdout)
    local r = json.decode(read(out .. "/report.json"))
    assert.equal(14, #r.groups) -- 6 layers x (attention, MLP) + output + token_embd
    local same = group(r, "blk.2.ffn")
    assert.is_true(same.certified_identical)
    assert.equal(0, same.recovered)
    assert.matches("blk.2.ffn: recovered 0 %(identical in A and B: certified, no pass%)", stderr)
    -- the output group's share against the written file with output.weight in f32
    local base = mean_kl(a, b)
    local with_output = mean_kl(a, tiny(dir, "bo", "q4_0", { SAME[1], SAME[2], SAME[3], "output.weight=f32" }))
    assert.is_true(math.abs(r.base.divergence - base) <= 1e-9 * base)
    local want = (base - with_output) / base
    assert.is_true(math.abs(group(r, "output").recovered - want) <= 1e-9, tostring(group(r, "output").recovered)
      .. " vs " .. want)
    -- the recipe: one anchored line per weight, the chosen groups' in q8_0, the others in B's type
    local chosen = {}
    for _, name in ipairs(r.selection.chosen) do chosen[name] = true end
    local lines = {}
    for l in read(out .. "/tensor-types.txt"):gmatch("[^\n]+") do lines[#lines + 1] = l end
    local bm = ember.load(b)
    local n2 = 0
    for _, t in ipairs(bm:tensors()) do
      if #t.shape >= 2 then
        n2 = n2 + 1
        local g = t.name:match("^(blk%.%d+%.%a+)_") or t.name:gsub("%.weight$", "")
        local want_type = chosen[g] and "q8_0" or t.type:lower()
        assert.equal("^" .. t.name:gsub("[%.%-]", "\\%0") .. "$=" .. want_type, lines[n2])
      end
    end
    bm:close()
    assert.equal(n2, #lines)
    assert.matches("%-%-pure %-%-tensor%-type%-file", read(out .. "/command.txt"))
  end)

  it("is deterministic: the same recipe and selection twice", function()
    local c1 = run(dir .. "/r1", "--no-verify", "--no-plot")
    local c2 = run(dir .. "/r2", "--no-verify", "--no-plot")
    assert.equal(0, c1)
    assert.equal(0, c2)
    assert.equal(read(dir .. "/r1/tensor-types.txt"), read(dir .. "/r2/tensor-types.txt"))
    local s1 = json.decode(read(dir .. "/r1/report.json")).selection
    local s2 = json.decode(read(dir .. "/r2/report.json")).selection
    assert.are.same(s1, s2)
  end)

  it("refuses bad input with clear errors", function()
    local other = tiny(dir, "qwen", "f32", nil, "qwen3")
    local code, _, err = cli.ember("quant-recipe", "--reference", other, "--quantized", b, "--prompts", prompts,
      "--out", dir .. "/x1", "--no-verify")
    assert.equal(1, code)
    assert.matches("'qwen3' model and B .* a 'llama' one", err)
    code, _, err = run(dir .. "/x2", "--no-verify", "--budget-mib", "0.000001")
    assert.equal(1, code)
    assert.matches("budget%-mib: .* smaller than any group's added bytes", err)
    code, _, err = run(dir .. "/x3", "--no-verify", "--types", "q9_9")
    assert.equal(2, code)
    assert.matches("%-%-types: 'q9_9' is not a weight type", err)
    code, _, err = run(dir .. "/x4", "--metric", "prob:3")
    assert.equal(2, code)
    assert.matches("measures kl or logit%-diff", err)
    code, _, err = run(dir .. "/x5", "--held-out", prompts, "--split")
    assert.equal(2, code)
  end)

  it("round-trips through llama-quantize: the file's types are the recipe's, measured on held-out prompts",
    function()
      local q = os.getenv("LLAMA_QUANTIZE")
      if not q or q == "" then q = "../shared/bench/llama.cpp/llama-quantize" end
      if not io.open(q, "rb") then
        pending("no llama-quantize (set LLAMA_QUANTIZE, or ../shared/bench/llama.cpp/llama-quantize): skipped")
        return
      end
      local out = dir .. "/v"
      local code, stdout, err = run(out, "--split", "--llama-quantize", q, "--no-plot")
      assert.equal(0, code, err)
      local r = json.decode(read(out .. "/report.json"))
      local v = r.verification
      assert.is_true(v.held_out)
      assert.equal(#PROMPTS // 2, v.prompts)
      assert.is_true(v.round_trip)
      -- read the quantized file's table ourselves
      local m = ember.load(out .. "/recipe.gguf")
      local types = {}
      for _, t in ipairs(m:tensors()) do types[t.name] = t.type:lower() end
      m:close()
      for l in read(out .. "/tensor-types.txt"):gmatch("[^\n]+") do
        local pat, ty = l:match("^%^(.*)%$=(.*)$")
        assert.equal(ty, types[pat:gsub("\\(.)", "%1")], l)
      end
      assert.is_true(v.bytes > v.b_bytes and v.bytes < v.a_bytes)
      assert.matches("verification with llama%-quantize on held%-out prompts", stdout)
    end)
end)

describe("ember quant-recipe's first pass in shards and resumed", function()
  local dir, a, b, prompts, plain
  setup(function()
    dir = H.tmpdir()
    a, b = tiny(dir, "a", "f32"), tiny(dir, "b", "q4_0", SAME)
    prompts = write_prompts(dir .. "/prompts.jsonl", PROMPTS)
  end)
  teardown(H.cleanup)

  local function run(out, ...)
    return cli.ember("quant-recipe", "--reference", a, "--quantized", b, "--prompts", prompts, "--out", out,
      "--no-verify", "--no-plot", ...)
  end
  local function report(out) return json.decode(read(out .. "/report.json")) end
  -- the same groups (every share bit for bit, through the JSON), selection and recipe as the plain run
  local function same_as_plain(out)
    plain = plain or (function()
      local code, _, err = run(dir .. "/plain")
      assert.equal(0, code, err)
      return report(dir .. "/plain")
    end)()
    local r = report(out)
    assert.are.same(plain.groups, r.groups)
    assert.are.same(plain.selection, r.selection)
    assert.equal(read(dir .. "/plain/tensor-types.txt"), read(out .. "/tensor-types.txt"))
    return r
  end

  it("two shards and a merge give the plain run's result, measuring nothing again", function()
    for i = 0, 1 do
      local code, _, err = run(dir .. "/s" .. i, "--shard", i .. "/2")
      assert.equal(0, code, err)
      assert.matches("shard " .. i .. "/2: 7 groups measured, 0 taken as saved", err)
      assert.is_nil(io.open(dir .. "/s" .. i .. "/report.json")) -- a shard stops after its first pass
    end
    local code, _, err = cli.ember("quant-recipe", "merge", dir .. "/merged", dir .. "/s0", dir .. "/s1")
    assert.equal(0, code, err)
    local r = same_as_plain(dir .. "/merged")
    assert.equal(0, r.timing.first_pass_measured)
    assert.equal(14, r.timing.first_pass_resumed)
  end)

  it("--jobs 2 runs the shards as processes into OUT.shards and gives the plain run's result", function()
    -- the shards are `ember` processes: the launcher itself runs the command
    local launcher = require("helpers.fixtures").build .. "/ember"
    if not io.open(launcher, "rb") then return pending("missing " .. launcher) end
    local q = require("ember.store.fs").shell_quote
    local cmd = string.format("%s quant-recipe --reference %s --quantized %s --prompts %s --out %s --no-verify "
      .. "--no-plot --jobs 2 >/dev/null 2>%s", launcher, q(a), q(b), q(prompts), q(dir .. "/j"), q(dir .. "/j.err"))
    local ok = os.execute(cmd)
    local err = read(dir .. "/j.err")
    assert.is_true(ok == true, err)
    assert.matches("first pass: 14/14 groups in 2 shards", err)
    assert.is_not_nil(io.open(dir .. "/j.shards/1/first-pass.json"))
    same_as_plain(dir .. "/j")
  end)

  it("a stopped run resumes from its first-pass.json: the groups saved are taken, the rest measured", function()
    local out = dir .. "/stopped"
    assert.equal(0, (run(out, "--shard", "1/2"))) -- leaves half the groups saved, as a stop would
    local code, _, err = run(out)
    assert.equal(0, code, err)
    assert.matches("first pass: 7 groups measured before, taken as saved", err)
    local r = same_as_plain(out)
    assert.equal(7, r.timing.first_pass_measured)
    assert.equal(7, r.timing.first_pass_resumed)
  end)

  it("refuses a finished --out, a foreign one, other settings and a directory that is no shard", function()
    assert.equal(0, (run(dir .. "/done")))
    local code, _, err = run(dir .. "/done")
    assert.equal(2, code)
    assert.matches("holds a finished run %(report.json%)", err)
    os.execute("mkdir -p " .. dir .. "/foreign && touch " .. dir .. "/foreign/x")
    code, _, err = run(dir .. "/foreign")
    assert.equal(2, code)
    assert.matches("is not a stopped quant%-recipe run %(no first%-pass.json%)", err)
    assert.equal(0, (run(dir .. "/kl", "--shard", "0/2")))
    code, _, err = run(dir .. "/kl", "--metric", "logit-diff:3,4")
    assert.equal(1, code)
    assert.matches("kl/first%-pass.json was measured with other settings", err)
    code, _, err = cli.ember("quant-recipe", "merge", dir .. "/m", dir .. "/foreign")
    assert.equal(2, code)
    assert.matches("holds no first%-pass.json %(not a shard directory%)", err)
    code, _, err = run(dir .. "/both", "--jobs", "2", "--shard", "0/2")
    assert.equal(2, code)
    assert.matches("%-%-jobs and %-%-shard cannot be combined", err)
  end)
end)
