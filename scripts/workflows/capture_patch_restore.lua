-- capture_patch_restore.lua — the frozen restoration criterion (SPEC §6.4) on one model:
--   A baseline + capture; B zero-layer-output L:mlp + capture; compare A/B (must differ);
--   C patch L:after_mlp from A in prefill and every decode + capture; compare A/C (must be
--   exact-semantic or stricter, captured logits equal by sha256, generated ids equal).
-- Equal generated text alone is NOT accepted as evidence: every captured tensor is compared.
--
-- ember-lua scripts/workflows/capture_patch_restore.lua [--model M.gguf] [--tokenizer T.json]
--     [--prompt TEXT] [--layer 4] [--max-tokens 4] [--kernels K] [--threads N] [--out DIR]
-- Exit 0 when the criterion holds, 1 when it fails, 2 for a usage error.

local cli = require("ember.cli")
local selectors = require("ember.selectors")

local FLAGS = {
  model = { name = "model", kind = "path", meta = "FILE.gguf" },
  tokenizer = { name = "tokenizer", kind = "path", meta = "FILE" },
  arch = { name = "arch", kind = "string", meta = "ARCH" },
  prompt = { name = "prompt", kind = "string", meta = "TEXT" },
  layer = { name = "layer", kind = "uint", meta = "N" },
  ["max-tokens"] = { name = "max-tokens", kind = "uint", meta = "N" },
  kernels = { name = "kernels", kind = function(s)
    return selectors.parse_choice(s, { "auto", "reference", "avx2", "avx512" }, "kernel set")
  end, meta = "SET" },
  threads = { name = "threads", kind = "uint", meta = "N" },
  out = { name = "out", kind = "path", meta = "DIR" },
  help = { name = "help", kind = "bool" },
}

local USAGE = [[
usage: capture_patch_restore.lua [--model M.gguf] [--tokenizer T.json] [--arch ARCH] [--prompt TEXT]
                                 [--layer 4] [--max-tokens 4] [--kernels SET] [--threads N] [--out DIR]
Runs sessions A (baseline), B (zero L:mlp), C (patch L:after_mlp from A), all with full capture,
and checks the restoration criterion. Default model: build/models/tiny-llama-q8_0.gguf.
--out DIR keeps the three artifacts in DIR (which must not exist); otherwise a temporary directory
is used and removed when the criterion holds.
]]

local function default_model()
  local builtin = require("ember.builtin")
  local ok, path = pcall(builtin.path, "build/models/tiny-llama-q8_0.gguf")
  if ok then return path end
  -- the project's own tiny model, made on first use like ./run.sh does
  local maker_ok, maker = pcall(builtin.path, "build/make-tiny-model")
  if not maker_ok then
    error("no --model given and build/models/tiny-llama-q8_0.gguf does not exist (build the project first)", 0)
  end
  local root = maker:gsub("/?build/make%-tiny%-model$", "")
  local target = (root == "" and "." or root) .. "/build/models/tiny-llama-q8_0.gguf"
  local fs = require("ember.fs")
  fs.mkdir_p(fs.dirname(target))
  local cmd = string.format("%s --family llama --dtype q8_0 --seed 7 --out %s >&2", fs.shell_quote(maker),
    fs.shell_quote(target))
  if os.execute(cmd) ~= true then error("could not create the default tiny model with " .. maker, 0) end
  return target
end

local function main(args)
  local ok, o = pcall(cli.parse_flags, args, 1, FLAGS)
  if not ok then
    io.stderr:write("capture_patch_restore: ", tostring(o), "\n", USAGE)
    return 2
  end
  if o.help then io.stdout:write(USAGE); return 0 end

  local ember = require("ember")
  local fs = require("ember.fs")
  local workflow = require("ember.workflow")
  local model_path = o.model or default_model()
  local model = ember.load { model = model_path, tokenizer = o.tokenizer, arch = o.arch, kernels = o.kernels,
    threads = o.threads }
  local out_dir, temp_root = o.out, nil
  if not out_dir then
    temp_root = fs.make_temp_dir("ember-cpr")
    out_dir = fs.join(temp_root, "artifacts")
  end
  local argv = { "capture_patch_restore.lua", table.unpack(args) }
  local ok_run, report = pcall(workflow.capture_patch_restore, {
    model = model, tokenizer_path = o.tokenizer, prompt = o.prompt or "The quick brown fox jumps over the lazy dog.",
    layer = o.layer or 4, max_tokens = o["max-tokens"] or 4, out_dir = out_dir, argv = argv,
  })
  if not ok_run then
    -- a run that could not complete leaves no temporary directory behind (--out DIR is kept)
    if temp_root then fs.remove_tree(temp_root) end
    error(report, 0)
  end
  -- temporary artifacts are kept when the criterion fails, for inspection
  local remove = temp_root ~= nil and report.ok
  io.stdout:write(workflow.format(report, model.info, not remove))
  if remove then
    fs.remove_tree(temp_root)
    io.stdout:write("(artifacts were temporary; use --out DIR to keep them)\n")
  end
  return report.ok and 0 or 1
end

local ok, code = pcall(main, arg)
if not ok then
  io.stderr:write("capture_patch_restore: ", tostring(code), "\n")
  code = 1
end
os.exit(code)
