/* tiny_tokenizer.h — a small byte-level BPE vocabulary for tiny test models, written as GGUF
 * `tokenizer.ggml.*` metadata so a model file is usable with text prompts on its own.
 *
 * Vocabulary (n_vocab >= 258 tokens):
 *   ids 0..255            the 256 byte symbols of GPT-2's byte-to-unicode map, in GPT-2's order
 *                         ('!' .. '~', then U+00A1.., then the remapped bytes U+0100 'Ā' .. U+0143)
 *   ids 256..n_vocab-3    results of BPE merges learnt from a short built-in English text, in merge
 *                         order; when the text runs out of merges, "<|reserved_N|>" control tokens
 *   id  n_vocab-2         "<|begin_of_text|>" (BOS, control)
 *   id  n_vocab-1         "<|end_of_text|>"   (EOS, control)
 * Every merge's two parts and its result are tokens. The same n_vocab always gives the same file.
 */
#ifndef EMBER_TINY_TOKENIZER_H
#define EMBER_TINY_TOKENIZER_H

#include "gguf_writer.h"

#define EMBER_TINY_TOKENIZER_MIN_VOCAB 258

/* Sets tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,
 * add_bos_token,add_eos_token}. `pre` is the pre-tokenizer name ("llama-bpe", "qwen2", "gpt-2"). */
ember_status ember_tiny_tokenizer_build(ember_gguf_writer *w, int64_t n_vocab, const char *pre, bool add_bos,
                                        ember_error *err);

/* The byte-level symbol of byte b as UTF-8 (1 or 2 bytes + NUL) and its token id. */
void ember_tiny_tokenizer_byte_symbol(uint8_t b, char out[3]);
int32_t ember_tiny_tokenizer_byte_id(uint8_t b);

#endif
