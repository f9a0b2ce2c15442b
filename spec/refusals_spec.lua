-- Inspection surfaces refuse active experiments (SPEC §7): extraction, probes, demo, interactive
-- and benchmark, each with every experiment flag ember.cli.flags lists. The refusal comes before the
-- model runs: the model path given does not exist, so a check made after loading would fail
-- differently (exit 1, "cannot open").

local C = require("helpers.cli")
local ember_cli = C.ember
local flags = require("ember.cli.flags")

local MISSING = "/nonexistent/refusal-model.gguf"

-- a value for each experiment flag (never read: the refusal comes first)
local VALUE = { ["zero-layer-output"] = "1:mlp", ["ablate-expert"] = "1:0", steer = "1:after_layer:v.npy",
  ["control-vector"] = "cv.gguf", ["sae-steer"] = "saes/x:3:2" }

local function refused(what, args, flag)
  local full = { table.unpack(args) }
  full[#full + 1] = "--" .. flag
  full[#full + 1] = VALUE[flag] or "x"
  local code, out, err = ember_cli(table.unpack(full))
  assert.equal(2, code, what .. " --" .. flag .. ": " .. err)
  assert.equal("", out)
  assert.matches("'" .. what .. "' refuses active experiments (--" .. flag .. "): the meaning of pre- vs "
    .. "post-intervention values is not defined", err, 1, true)
end

describe("refusals of active experiments", function()
  it("lists the experiment flags in one place", function()
    assert.same({ "experiment", "activation-stats", "zero-layer-output", "ablate-expert", "capture-activations",
      "activation-patch", "steer", "control-vector", "sae-steer" }, flags.EXPERIMENT_FLAGS)
  end)

  it("--extract-hidden refuses every experiment flag", function()
    for _, f in ipairs(flags.EXPERIMENT_FLAGS) do
      refused("--extract-hidden", { "--model", MISSING, "--prompt", "x", "--extract-hidden", "1", "--extract-out",
        "/tmp/never.safetensors" }, f)
    end
  end)

  it("--prompts (batch extraction) refuses every experiment flag", function()
    for _, f in ipairs(flags.EXPERIMENT_FLAGS) do
      refused("--extract-hidden", { "--model", MISSING, "--prompts", "/nonexistent/p.jsonl", "--extract-hidden", "1",
        "--extract-out", "/tmp/never.safetensors" }, f)
    end
  end)

  it("probe train refuses every experiment flag", function()
    for _, f in ipairs(flags.EXPERIMENT_FLAGS) do
      refused("probe", { "probe", "train", "--model", MISSING, "--data", "/nonexistent/d.jsonl", "--layer", "1" }, f)
    end
  end)

  it("probe eval refuses every experiment flag", function()
    for _, f in ipairs(flags.EXPERIMENT_FLAGS) do
      refused("probe", { "probe", "eval", "--probe", "/nonexistent/p.json", "--data", "/nonexistent/d.jsonl" }, f)
    end
  end)

  it("demo refuses every experiment flag", function()
    for _, f in ipairs(flags.EXPERIMENT_FLAGS) do refused("demo", { "demo", "--model", MISSING }, f) end
  end)

  it("interactive refuses every experiment flag", function()
    for _, f in ipairs(flags.EXPERIMENT_FLAGS) do refused("interactive", { "interactive", "--model", MISSING }, f) end
  end)

  it("benchmark refuses every experiment flag", function()
    for _, f in ipairs(flags.EXPERIMENT_FLAGS) do refused("benchmark", { "benchmark", "--model", MISSING }, f) end
  end)

  it("a subcommand placed after flags is refused the same way, else told to come first", function()
    for _, what in ipairs({ "demo", "interactive", "benchmark", "probe" }) do
      refused(what, { "--model", MISSING, what }, "zero-layer-output")
      local code, _, err = ember_cli("--model", MISSING, what)
      assert.equal(2, code)
      assert.matches("'" .. what .. "' must be the first argument", err, 1, true)
    end
  end)

  it("without an experiment the same commands get as far as the model (which does not exist)", function()
    local code, _, err = ember_cli("demo", "--model", MISSING)
    assert.equal(1, code)
    assert.matches(MISSING, err, 1, true)
    code, _, err = ember_cli("--model", MISSING, "--prompt", "x", "--extract-hidden", "1", "--extract-out",
      os.tmpname() .. ".safetensors")
    assert.equal(1, code)
    assert.matches(MISSING, err, 1, true)
  end)
end)
