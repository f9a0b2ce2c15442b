-- fuzz/artifact_sections.lua — the provenance sections of the sample activation artifact the fuzz
-- seeds and fuzz_formats write (one copy); data only, no I/O.
return {
  created_at_unix = 1700000000, tool = { name = "ember", version = "0" },
  model = { path = "m.gguf", sha256 = string.rep("a", 64), family = "llama", n_layers = 2, hidden_size = 3,
    n_vocab = 4 },
  tokenizer = { source = "gguf", sha256 = string.rep("b", 64) },
  -- the reader binds a kept text to its digest
  prompt = { sha256 = require("ember.core").sha256("hi"), source = "text", text = "hi", withheld = false,
    token_count = 2 },
  input_ids = { 1, 2 }, generated_ids = { 3 },
  settings = { max_tokens = 1, temperature = 0.0, top_k = 0, top_p = 1.0, seed = 0 },
  execution = { kernels = "reference", threads = 1 },
  experiment = { name = "capture", args = "", modified = false, members = {} },
  capture = { config = {}, config_sha256 = string.rep("d", 64), output_dir = "x", record_count = 0,
    dropped_records = 0 },
  argv = { "ember" },
}
