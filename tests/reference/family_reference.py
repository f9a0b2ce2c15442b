#!/usr/bin/python3
# family_reference.py — the exact float64 forward pass of the gemma2, gemma3, olmo2, gptneox, phi3 and qwen3moe blocks over an
# F32 GGUF (a tiny model dequantized by llama-quantize), read with its own small GGUF reader, for the
# parity fixtures under tests/fixtures/parity-new (tests/reference/make_parity_new.sh runs it).
# It follows llama.cpp's graphs of those architectures (exact tanh-GELU, unquantized activations).
#
#   family_reference.py MODEL_F32.gguf IDS(comma) GREEDY(comma) OUT_DIR [--inside]
# writes OUT_DIR/exact_logits.npy (rows: the logits after each token of IDS + GREEDY) and, with
# --inside, OUT_DIR/boundaries.npz and OUT_DIR/heads.npz (the parity README's layouts).
import struct, sys
import numpy as np

# ---- GGUF (v2/v3), F32 tensors only ----
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(SCALARS[t])

    assert data[:4] == b"GGUF", path + ": not a GGUF file"
    pos = 4
    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, dims, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    tensors = {}
    for name, dims, ttype, off in infos:
        assert ttype == 0, name + ": the reference reads F32 files only (dequantize with llama-quantize)"
        count = int(np.prod(dims))
        a = np.frombuffer(data, dtype="<f4", count=count, offset=base + off).astype(np.float64)
        tensors[name] = a.reshape(list(reversed(dims))) if len(dims) > 1 else a
    return meta, tensors


# ---- the pieces ----
def rmsnorm(x, w, eps):
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_neox(x, pos, n_rot, base, factor):
    """x: [T, heads, hd]; rotates (i, i + n_rot/2) by pos / factor * base^(-2i/n_rot)."""
    half = n_rot // 2
    freq = base ** (-2.0 * np.arange(half) / n_rot) / factor
    theta = np.outer(pos, freq)[:, None, :]
    c, s = np.cos(theta), np.sin(theta)
    a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
    out = x.copy()
    out[..., :half] = a * c - b * s
    out[..., half:n_rot] = a * s + b * c
    return out


class Config:
    def __init__(self, meta):
        arch = self.arch = meta["general.architecture"]
        g = lambda k, d=None: meta.get(arch + "." + k, d)
        self.n_layer, self.d, self.n_head = g("block_count"), g("embedding_length"), g("attention.head_count")
        self.n_kv = g("attention.head_count_kv", self.n_head)
        self.hd = g("attention.key_length", self.d // self.n_head)
        self.n_rot = g("rope.dimension_count", self.hd)
        self.eps = g("attention.layer_norm_rms_epsilon")
        self.base = g("rope.freq_base", 10000.0)
        self.factor = g("rope.scaling.factor", 1.0) if g("rope.scaling.type", "linear") == "linear" else 1.0
        self.window = g("attention.sliding_window", 4096 if arch == "gemma2" else 0)
        period = {"gemma2": 2, "gemma3": g("attention.sliding_window_pattern", 6), "olmo2": 4}[arch]
        slide = lambda l: self.window > 0 and (period == 0 or l % period < period - 1)
        self.sliding = [slide(l) for l in range(self.n_layer)]
        # sliding layers' RoPE: gemma3 their own base (10000) unscaled, olmo2 the global base unscaled
        self.base_swa = g("rope.freq_base_swa", 10000.0) if arch == "gemma3" else self.base
        self.scale_swa = arch == "gemma2"
        self.attn_cap = g("attn_logit_softcapping", 50.0) if arch == "gemma2" else 0.0
        self.final_cap = g("final_logit_softcapping", {"gemma2": 30.0}.get(arch, 0.0))
        big = {"gemma2": 46, "gemma3": 62}.get(arch)
        self.scale = 1.0 / np.sqrt(self.d // self.n_head if self.n_layer == big else self.hd)


def attention(cfg, l, q, k, v):
    """q: [T, H, hd], k/v: [T, G, hd] at positions 0..T-1 -> pattern [H, T, T], mixed [T, H*hd]."""
    T, H = q.shape[0], cfg.n_head
    group = H // cfg.n_kv
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("thd,uhd->htu", q, kk) * cfg.scale
    if cfg.attn_cap > 0:
        s = cfg.attn_cap * np.tanh(s / cfg.attn_cap)
    t, u = np.arange(T)[:, None], np.arange(T)[None, :]
    visible = u <= t
    if cfg.sliding[l]:
        visible &= u > t - cfg.window
    s = np.where(visible[None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p, np.einsum("htu,uhd->thd", p, vv).reshape(T, H * cfg.hd)


def forward(cfg, w, ids):
    """Every row's logits and the values at each hook point, over ids at positions 0..T-1."""
    T, H, G, hd, eps = len(ids), cfg.n_head, cfg.n_kv, cfg.hd, cfg.eps
    gemma = cfg.arch.startswith("gemma")
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][ids] * (np.sqrt(np.float32(cfg.d)) if gemma else 1.0)
    rec = {}
    for l in range(cfg.n_layer):
        W = lambda s: w["blk.%d.%s.weight" % (l, s)]
        rec["before_layer.%d" % l] = x.copy()
        h = rmsnorm(x, W("attn_norm"), eps) if gemma else x
        q, k, v = h @ W("attn_q").T, h @ W("attn_k").T, h @ W("attn_v").T
        if cfg.arch == "olmo2":  # QK-norm over the full width
            q, k = rmsnorm(q, W("attn_q_norm"), eps), rmsnorm(k, W("attn_k_norm"), eps)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, G, hd), v.reshape(T, G, hd)
        if cfg.arch == "gemma3":  # per-head QK-norm
            q, k = rmsnorm(q, W("attn_q_norm"), eps), rmsnorm(k, W("attn_k_norm"), eps)
        own = cfg.sliding[l] and not cfg.scale_swa
        base, factor = (cfg.base_swa, 1.0) if own else (cfg.base, cfg.factor)
        q, k = rope_neox(q, pos, cfg.n_rot, base, factor), rope_neox(k, pos, cfg.n_rot, base, factor)
        p, mixed = attention(cfg, l, q, k, v)
        rec["attention_pattern.%d" % l] = p.reshape(H * T, T)
        rec["attention_heads.%d" % l] = mixed
        o = rmsnorm(mixed @ W("attn_output").T, W("post_attention_norm"), eps)
        rec["after_attention.%d" % l] = o
        x = x + o
        h = rmsnorm(x, W("ffn_norm"), eps) if gemma else x
        gate, up = h @ W("ffn_gate").T, h @ W("ffn_up").T
        a = (gelu_tanh(gate) if gemma else silu(gate)) * up
        rec["mlp_activation.%d" % l] = a
        m = rmsnorm(a @ W("ffn_down").T, W("post_ffw_norm"), eps)
        rec["after_mlp.%d" % l] = m
        x = x + m
        rec["after_layer.%d" % l] = x.copy()
    return rec


def head(cfg, w, x):
    """Final norm, LM head (tied when the file has no output.weight), final softcap."""
    out = w.get("output.weight", w["token_embd.weight"])
    z = rmsnorm(x, w["output_norm.weight"], cfg.eps) @ out.T
    return cfg.final_cap * np.tanh(z / cfg.final_cap) if cfg.final_cap > 0 else z


# ---- gptneox (Pythia): LayerNorm with bias, fused QKV, partial NEOX RoPE, parallel residual ----
class NeoxConfig:
    def __init__(self, meta):
        g = lambda k, d=None: meta.get("gptneox." + k, d)
        self.n_layer, self.d, self.n_head = g("block_count"), g("embedding_length"), g("attention.head_count")
        self.n_kv = self.n_head
        self.hd = self.d // self.n_head
        self.n_rot = g("rope.dimension_count", self.hd)
        self.base = g("rope.freq_base", 10000.0)
        self.eps = g("attention.layer_norm_epsilon")
        self.parallel = g("use_parallel_residual")
        self.scale, self.attn_cap, self.sliding, self.window = 1.0 / np.sqrt(self.hd), 0.0, [False] * self.n_layer, 0


def layernorm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps) * w + b


def forward_neox(cfg, w, ids):
    T, H, hd, d = len(ids), cfg.n_head, cfg.hd, cfg.d
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][ids]
    rec = {}
    for l in range(cfg.n_layer):
        W = lambda s: w["blk.%d.%s" % (l, s)]
        rec["before_layer.%d" % l] = x.copy()
        h = layernorm(x, W("attn_norm.weight"), W("attn_norm.bias"), cfg.eps)
        qkv = h @ W("attn_qkv.weight").T + W("attn_qkv.bias")
        q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(T, H, hd) for i in range(3))
        q, k = rope_neox(q, pos, cfg.n_rot, cfg.base, 1.0), rope_neox(k, pos, cfg.n_rot, cfg.base, 1.0)
        p, mixed = attention(cfg, l, q, k, v)
        rec["attention_pattern.%d" % l] = p.reshape(H * T, T)
        rec["attention_heads.%d" % l] = mixed
        a = mixed @ W("attn_output.weight").T + W("attn_output.bias")
        rec["after_attention.%d" % l] = a
        if not cfg.parallel:
            x = x + a
        u = gelu_tanh(layernorm(x, W("ffn_norm.weight"), W("ffn_norm.bias"), cfg.eps) @ W("ffn_up.weight").T
                      + W("ffn_up.bias"))
        rec["mlp_activation.%d" % l] = u
        m = u @ W("ffn_down.weight").T + W("ffn_down.bias")
        rec["after_mlp.%d" % l] = m
        x = x + m + (a if cfg.parallel else 0.0)
        rec["after_layer.%d" % l] = x.copy()
    return rec


def norm_neox(cfg, w, x):
    return layernorm(x, w["output_norm.weight"], w["output_norm.bias"], cfg.eps)


def head_neox(cfg, w, x):
    return norm_neox(cfg, w, x) @ w["output.weight"].T


# ---- phi3: the llama block over fused attn_qkv / ffn_up ([gate | up]), NEOX RoPE with LongRoPE's
# factors (the long ones when llama-ref-logits' context, max(256, tokens + 16), exceeds the original
# context), a sliding window on every layer where the file sets one ----
class PhiConfig:
    def __init__(self, meta, w, n_tokens):
        g = lambda k, d=None: meta.get("phi3." + k, d)
        self.n_layer, self.d, self.n_head = g("block_count"), g("embedding_length"), g("attention.head_count")
        self.n_kv = g("attention.head_count_kv", self.n_head)
        self.hd = self.d // self.n_head
        self.n_rot = g("rope.dimension_count", self.hd)
        self.base, self.eps = g("rope.freq_base", 10000.0), g("attention.layer_norm_rms_epsilon")
        self.window = g("attention.sliding_window", 0)
        self.sliding = [self.window > 0] * self.n_layer
        self.scale, self.attn_cap, self.final_cap = 1.0 / np.sqrt(self.hd), 0.0, 0.0
        orig = g("rope.scaling.original_context_length", g("context_length"))
        which = "long" if max(256, n_tokens + 16) > orig else "short"
        self.factors = w.get("rope_factors_%s.weight" % which, 1.0)
        # LongRoPE's attention factor multiplies the rotation's cosines and sines (llama.cpp's mscale)
        self.mscale = g("rope.scaling.attn_factor", 1.0)


def forward_phi3(cfg, w, ids):
    T, H, G, hd, d, eps = len(ids), cfg.n_head, cfg.n_kv, cfg.hd, cfg.d, cfg.eps
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][ids]
    rec = {}
    for l in range(cfg.n_layer):
        W = lambda s: w["blk.%d.%s.weight" % (l, s)]
        rec["before_layer.%d" % l] = x.copy()
        qkv = rmsnorm(x, W("attn_norm"), eps) @ W("attn_qkv").T
        kv = G * hd
        q, k, v = qkv[:, :d].reshape(T, H, hd), qkv[:, d:d + kv].reshape(T, G, hd), qkv[:, d + kv:].reshape(T, G, hd)
        q, k = rope_neox(q, pos, cfg.n_rot, cfg.base, cfg.factors), rope_neox(k, pos, cfg.n_rot, cfg.base, cfg.factors)
        q[..., :cfg.n_rot] *= cfg.mscale
        k[..., :cfg.n_rot] *= cfg.mscale
        p, mixed = attention(cfg, l, q, k, v)
        rec["attention_pattern.%d" % l] = p.reshape(H * T, T)
        rec["attention_heads.%d" % l] = mixed
        o = mixed @ W("attn_output").T
        rec["after_attention.%d" % l] = o
        x = x + o
        gu = rmsnorm(x, W("ffn_norm"), eps) @ W("ffn_up").T
        n_ff = gu.shape[1] // 2
        a = silu(gu[:, :n_ff]) * gu[:, n_ff:]
        rec["mlp_activation.%d" % l] = a
        m = a @ W("ffn_down").T
        rec["after_mlp.%d" % l] = m
        x = x + m
        rec["after_layer.%d" % l] = x.copy()
    return rec


# ---- qwen3moe: the qwen3 attention (per-head QK-norm, NEOX RoPE) and routed SwiGLU experts: softmax
# of the router's logits over every expert, the top k, their probabilities renormalised ----
class MoeConfig:
    def __init__(self, meta):
        g = lambda k, d=None: meta.get("qwen3moe." + k, d)
        self.n_layer, self.d, self.n_head = g("block_count"), g("embedding_length"), g("attention.head_count")
        self.n_kv = g("attention.head_count_kv", self.n_head)
        self.hd = g("attention.key_length", self.d // self.n_head)
        self.n_rot = g("rope.dimension_count", self.hd)
        self.base, self.eps = g("rope.freq_base", 10000.0), g("attention.layer_norm_rms_epsilon")
        self.k = g("expert_used_count")
        self.scale, self.attn_cap, self.final_cap = 1.0 / np.sqrt(self.hd), 0.0, 0.0
        self.sliding, self.window = [False] * self.n_layer, 0


def moe(cfg, W, h):
    """h: [T, d] -> the mlp_activation slots [T, k*f] (choice order) and the weighted sum [T, d]."""
    logits = h @ W("ffn_gate_inp").T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    order = np.argsort(-p, axis=1, kind="stable")[:, :cfg.k]
    gate, up, down = W("ffn_gate_exps"), W("ffn_up_exps"), W("ffn_down_exps")  # [E, f, d], [E, f, d], [E, d, f]
    T, f = h.shape[0], gate.shape[1]
    act, out = np.zeros((T, cfg.k * f)), np.zeros_like(h)
    for t in range(T):
        wts = p[t, order[t]] / max(p[t, order[t]].sum(), 6.103515625e-5)
        for j, e in enumerate(order[t]):
            a = silu(gate[e] @ h[t]) * (up[e] @ h[t])
            act[t, j * f:(j + 1) * f] = a
            out[t] += wts[j] * (down[e] @ a)
    return act, out


def forward_moe(cfg, w, ids):
    T, H, G, hd, eps = len(ids), cfg.n_head, cfg.n_kv, cfg.hd, cfg.eps
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][ids]
    rec = {}
    for l in range(cfg.n_layer):
        W = lambda s: w["blk.%d.%s.weight" % (l, s)]
        rec["before_layer.%d" % l] = x.copy()
        h = rmsnorm(x, W("attn_norm"), eps)
        q, k, v = (h @ W("attn_q").T).reshape(T, H, hd), (h @ W("attn_k").T).reshape(T, G, hd), \
            (h @ W("attn_v").T).reshape(T, G, hd)
        q, k = rmsnorm(q, W("attn_q_norm"), eps), rmsnorm(k, W("attn_k_norm"), eps)
        q, k = rope_neox(q, pos, cfg.n_rot, cfg.base, 1.0), rope_neox(k, pos, cfg.n_rot, cfg.base, 1.0)
        p, mixed = attention(cfg, l, q, k, v)
        rec["attention_pattern.%d" % l] = p.reshape(H * T, T)
        rec["attention_heads.%d" % l] = mixed
        o = mixed @ W("attn_output").T
        rec["after_attention.%d" % l] = o
        x = x + o
        a, m = moe(cfg, W, rmsnorm(x, W("ffn_norm"), eps))
        rec["mlp_activation.%d" % l] = a
        rec["after_mlp.%d" % l] = m
        x = x + m
        rec["after_layer.%d" % l] = x.copy()
    return rec


# per architecture: its config, forward pass, final norm and head (the others: the blocks above)
BLOCKS = {"gptneox": (NeoxConfig, forward_neox, norm_neox, head_neox)}
RMS_BLOCKS = {"qwen3moe": (MoeConfig, forward_moe)}


def main():
    model, ids, greedy, out_dir = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    meta, w = read_gguf(model)
    final_norm = lambda cfg, w, x: rmsnorm(x, w["output_norm.weight"], cfg.eps)
    block = BLOCKS.get(meta["general.architecture"], (Config, forward, final_norm, head))
    if meta["general.architecture"] in RMS_BLOCKS:
        block = RMS_BLOCKS[meta["general.architecture"]] + (final_norm, head)
    prompt = [int(t) for t in ids.split(",")]
    gen = [int(t) for t in greedy.split(",")]
    if meta["general.architecture"] == "phi3":
        block = (lambda meta: PhiConfig(meta, w, len(prompt) + len(gen)), forward_phi3, final_norm, head)
    cfg, run, final_norm, logits = block[0](meta), block[1], block[2], block[3]
    rec = run(cfg, w, prompt + gen)
    np.save(out_dir + "/exact_logits.npy", logits(cfg, w, rec["after_layer.%d" % (cfg.n_layer - 1)]).astype("<f4"))
    if "--inside" not in sys.argv:
        return
    P, L = len(prompt), cfg.n_layer
    pre = run(cfg, w, prompt)  # the prefill alone: its patterns cover the prompt's keys only
    last = pre["after_layer.%d" % (L - 1)][P - 1:P]
    b = {k: v for k, v in pre.items() if k.split(".")[0] in ("before_layer", "after_attention", "after_mlp",
                                                             "after_layer")}
    b["before_logits"] = final_norm(cfg, w, last)
    b["after_logits"] = logits(cfg, w, last)
    np.savez_compressed(out_dir + "/boundaries.npz", **{k: v.astype("<f4") for k, v in b.items()})
    one = run(cfg, w, prompt + gen[:1])  # the first decode step is the last row over P + 1 tokens
    heads = {}
    for l in range(L):
        for st in ("attention_pattern", "attention_heads", "mlp_activation"):
            heads["%s.%d" % (st, l)] = pre["%s.%d" % (st, l)]
        heads["logit_lens.%d" % l] = logits(cfg, w, pre["after_layer.%d" % l][P - 1:P])
        pat = one["attention_pattern.%d" % l].reshape(cfg.n_head, P + 1, P + 1)
        heads["decode.attention_pattern.%d" % l] = pat[:, P, :]
        heads["decode.attention_heads.%d" % l] = one["attention_heads.%d" % l][P:P + 1]
        heads["decode.mlp_activation.%d" % l] = one["mlp_activation.%d" % l][P:P + 1]
    np.savez_compressed(out_dir + "/heads.npz", **{k: v.astype("<f4") for k, v in heads.items()})


if __name__ == "__main__":
    main()
