-- capture_patch_restore.lua — the frozen restoration criterion (SPEC §6.4) on one model:
--   A baseline + capture; B zero-layer-output L:mlp + capture; compare A/B (must differ);
--   C patch L:after_mlp from A in prefill and every decode + capture; compare A/C (must be
--   exact-semantic or stricter, captured logits equal by sha256, generated ids equal).
-- Equal generated text alone is NOT accepted as evidence: every captured tensor is compared.
--
-- ember-lua scripts/workflows/capture_patch_restore.lua [--model M.gguf] [--tokenizer T.json]
--     [--prompt TEXT] [--layer 4] [--max-tokens 4] [--kernels K] [--threads N] [--out DIR]
-- Exit 0 when the criterion holds, 1 when it fails, 2 for a usage error.

local flags = require("ember.cli.flags")

local FLAGS = {
  { "model", "path", "FILE.gguf" },
  { "tokenizer", "path", "FILE" },
  { "arch", "string", "ARCH" },
  { "prompt", "string", "TEXT" },
  { "layer", "uint", "N" },
  { "max-tokens", "uint", "N" },
  flags.option("kernels"),
  flags.option("threads"),
  { "out", "path", "DIR" },
  flags.option("help"),
}

local USAGE = [[
usage: capture_patch_restore.lua [--model M.gguf] [--tokenizer T.json] [--arch ARCH] [--prompt TEXT]
                                 [--layer 4] [--max-tokens 4] [--kernels SET] [--threads N] [--out DIR]
Runs sessions A (baseline), B (zero L:mlp), C (patch L:after_mlp from A), all with full capture,
and checks the restoration criterion. Default model: the tiny llama made on first use in
$XDG_CACHE_HOME/ember (else ~/.cache/ember).
--layer defaults to 4, or to the last layer of a model with 4 layers or fewer.
--out DIR keeps the three artifacts in DIR (which must not exist); otherwise a temporary directory
is used and removed when the criterion holds.
]]

local function main(o)
  local fs = require("ember.store.fs")
  local workflow = require("ember.run.workflow")
  local model_path = o.model or require("ember.model.default_model").path()
  local model = flags.load_model(o, { model = model_path })
  local out_dir, temp_root = o.out, nil
  if not out_dir then
    temp_root = fs.make_temp_dir("ember-cpr")
    out_dir = fs.join(temp_root, "artifacts")
  end
  local argv = { "capture_patch_restore.lua", table.unpack(arg) }
  local ok_run, report = pcall(workflow.capture_patch_restore, {
    model = model, tokenizer_path = o.tokenizer, prompt = o.prompt or "The quick brown fox jumps over the lazy dog.",
    -- layer 4 by default; a smaller model (a test fixture, a toy of one's own) its last layer,
    -- so that the README's own-model command runs on any model without --layer
    layer = o.layer or math.min(4, model.info.n_layers - 1), max_tokens = o["max-tokens"] or 4, out_dir = out_dir,
    argv = argv,
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

os.exit(flags.script("capture_patch_restore", FLAGS, USAGE, main, arg))
