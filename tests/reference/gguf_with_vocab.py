#!/usr/bin/python3
"""gguf_with_vocab.py: a copy of MODEL.gguf whose tokenizer.ggml.* keys are those of VOCAB.gguf
(a real vocabulary, e.g. ../shared/fixtures/tokenizers/llama-spm/vocab-only.gguf), so that llama.cpp
can load it and tokenize with that vocabulary (llama-ref-logits -p / -f). MODEL's embedding must
have as many rows as VOCAB has tokens (make-tiny-model --vocab N --no-tokenizer). Optional extra
tokens are appended to the vocabulary first (then MODEL needs that many more rows):

  gguf_with_vocab.py MODEL.gguf VOCAB.gguf OUT.gguf [--add TYPE:TEXT ...] [--pad N]

MODEL "-" writes a vocabulary-only file instead (no tensors: enough for ember.tokenizer{ gguf = },
not for llama.cpp); spec/tokenizer_hard_spec.lua makes its GGUF vocabularies this way.

VOCAB may instead be a Gemma 2/3 tokenizer.json: its vocabulary is then written as llama.cpp's
converter writes Gemma's SentencePiece model (tokenizer.ggml.model "llama", no space prefix, BOS
added; <0xNN> byte tokens, the special added tokens control and the others user-defined, <unk>
unknown), with score -id for every token: the order in which SentencePiece's BPE made the pieces,
which its merges follow (the scores of tokenizer.model itself are not in tokenizer.json).

TYPE is control, user or unused (llama.cpp's token types 3, 4 and 5); --pad N appends unused
tokens "[PADi]" (as the converter pads Phi-3's table) until there are N. Only the GGUF container is parsed here
(version 3, little-endian); the tensors are copied as they are. Never run by the tests."""
import struct
import sys

TYPES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, t):
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.take("I"), self.take("Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(TYPES[t])


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        sys.exit("%s: not a GGUF file" % path)
    r.pos = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    if version != 3:
        sys.exit("%s: GGUF version %d (3 expected)" % (path, version))
    kv = []
    for _ in range(n_kv):
        key = r.string()
        t = r.take("I")
        kv.append((key, t, r.value(t)))
    infos_start = r.pos
    for _ in range(n_tensors):
        r.string()
        nd = r.take("I")
        r.pos += 8 * nd + 4 + 8
    infos = data[infos_start:r.pos]
    align = next((v for k, t, v in kv if k == b"general.alignment"), 32)
    data_start = (r.pos + align - 1) // align * align
    return kv, n_tensors, infos, data[data_start:], align


def gemma_json_vocab(path):
    import json
    j = json.load(open(path, encoding="utf-8"))
    vocab = dict(j["model"]["vocab"])
    kinds = {}
    for a in j["added_tokens"]:
        vocab[a["content"]] = a["id"]
        kinds[a["id"]] = 3 if a["special"] else 4
    n = max(vocab.values()) + 1
    tokens = [b""] * n
    for text, i in vocab.items():
        tokens[i] = text.encode("utf-8")
    types = []
    for i, t in enumerate(tokens):
        if t == b"<unk>":
            types.append(2)
        elif len(t) == 6 and t.startswith(b"<0x") and t.endswith(b">"):
            types.append(6)
        else:
            types.append(kinds.get(i, 1))
    ids = {t: i for i, t in enumerate(tokens)}
    F32, U32, I32, BOOL = 6, 4, 5, 7
    return [(b"tokenizer.ggml.model", STRING, b"llama"), (b"tokenizer.ggml.pre", STRING, b"default"),
            (b"tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            (b"tokenizer.ggml.scores", ARRAY, (F32, [-float(i) for i in range(n)])),
            (b"tokenizer.ggml.token_type", ARRAY, (I32, types)),
            (b"tokenizer.ggml.bos_token_id", U32, ids[b"<bos>"]),
            (b"tokenizer.ggml.eos_token_id", U32, ids[b"<eos>"]),
            (b"tokenizer.ggml.unknown_token_id", U32, ids[b"<unk>"]),
            (b"tokenizer.ggml.padding_token_id", U32, ids[b"<pad>"]),
            (b"tokenizer.ggml.add_bos_token", BOOL, True), (b"tokenizer.ggml.add_eos_token", BOOL, False),
            (b"tokenizer.ggml.add_space_prefix", BOOL, False)]


def put_value(out, t, v):
    if t == STRING:
        out += struct.pack("<Q", len(v)) + v
    elif t == ARRAY:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for item in items:
            put_value(out, et, item)
    else:
        out += struct.pack("<" + TYPES[t], v)


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    model, vocab, out_path = argv[1:4]
    extra, pad = [], 0
    rest = argv[4:]
    while rest:
        if rest[0] == "--pad" and len(rest) >= 2:
            pad = int(rest[1])
        elif rest[0] == "--add" and len(rest) >= 2 and ":" in rest[1]:
            kind, text = rest[1].split(":", 1)
            extra.append(({"control": 3, "user": 4, "unused": 5}[kind], text.encode()))
        else:
            sys.exit("usage: --add TYPE:TEXT or --pad N (got %r)" % rest[:2])
        rest = rest[2:]
    if model == "-":
        kv, n_tensors, infos, tensors, align = [(b"general.architecture", STRING, b"llama")], 0, b"", b"", 32
    else:
        kv, n_tensors, infos, tensors, align = read_gguf(model)
    if vocab.endswith(".json"):
        vkv = gemma_json_vocab(vocab)
    else:
        vkv = [e for e in read_gguf(vocab)[0] if e[0].startswith(b"tokenizer.")]
    vkv = [(k, t, v) for k, t, v in vkv if k != b"tokenizer.chat_template"]
    n_tokens = next(len(v[1]) for k, t, v in vkv if k == b"tokenizer.ggml.tokens")
    extra += [(5, b"[PAD%d]" % i) for i in range(n_tokens + len(extra), pad)]
    if extra:
        for i, (k, t, v) in enumerate(vkv):
            et, items = v if t == ARRAY else (None, None)
            if k == b"tokenizer.ggml.tokens":
                vkv[i] = (k, t, (et, items + [text for _, text in extra]))
            elif k == b"tokenizer.ggml.token_type":
                vkv[i] = (k, t, (et, items + [kind for kind, _ in extra]))
            elif k == b"tokenizer.ggml.scores":
                vkv[i] = (k, t, (et, items + [0.0 for _ in extra]))
    kv = [e for e in kv if not e[0].startswith(b"tokenizer.")] + vkv
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kv)))
    for k, t, v in kv:
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", t)
        put_value(out, t, v)
    out += infos
    out += b"\0" * ((-len(out)) % align)
    out += tensors
    open(out_path, "wb").write(out)


if __name__ == "__main__":
    main(sys.argv)
