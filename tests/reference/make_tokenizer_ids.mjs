// make_tokenizer_ids.mjs: the token ids of tests/fixtures/tokenizers/hard.inp (strings separated by
// "\n__ggml_vocab_test__\n", as the shared vectors.inp) under a HuggingFace tokenizer.json, by
// tokenizers.js (npm @huggingface/tokenizers, the tokenizer of transformers.js): one line per string,
// the ids separated by spaces, without the special tokens the post-processor would add (no BOS);
// added tokens in the text are matched (HF always matches them). Never run by the tests.
//
//   node make_tokenizer_ids.mjs TOKENIZER.json [TOKENIZER_CONFIG.json] < hard.inp > NAME.out
// Run it where `npm install @huggingface/tokenizers@0.2.0` was run (NODE_PATH or a node_modules
// above the script); tests/reference/make_tokenizer_ids.sh runs it for every family.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [json, config] = process.argv.slice(2);
const tok = new Tokenizer(JSON.parse(readFileSync(json, "utf8")), config ? JSON.parse(readFileSync(config, "utf8")) : {});
const text = readFileSync(0, "utf8");
for (const s of text.split("\n__ggml_vocab_test__\n")) {
  const ids = tok.encode(s, { add_special_tokens: false }).ids;
  process.stdout.write(ids.join(" ") + "\n");
}
