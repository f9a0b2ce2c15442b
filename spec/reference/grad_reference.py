#!/usr/bin/python3
# grad_reference.py — an exact float64 forward pass of ember's families, written here from the
# GGUF file alone (its own reader: header, metadata, f32/f16/bf16/q8_0 tensors), and central finite
# differences of a metric of the last position's logits with respect to every stage's activation.
# ember's gradients (m:gradients, saved as safetensors) are checked against these
# (spec/gradients_spec.lua). Frozen modes: the attention probabilities and/or the norms' scales of
# the unperturbed pass are held while the finite differences move the activation.
#
#   grad_reference.py REQUEST.json    REQUEST: {model, ids, metric: {kind, a, b}, freeze: [...],
#                                     gradients: FILE.safetensors, stages: [...], samples: N,
#                                     seed: N, logits: FILE.safetensors (ember's last-row logits)}
# prints JSON: {logits_rel, checks: [{stage, layer, coord_rel, dir_rel, scale}]}
import json, struct, sys
import numpy as np

# ---- GGUF ------------------------------------------------------------------------------------
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.o:self.o + n].decode("utf-8", "replace")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, count = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(count)]
        return self.take(SCALAR[t])


def f16(raw):
    return np.frombuffer(raw, dtype="<f2").astype(np.float64)


def dequantize(t, raw, count):
    if t == 0:
        return np.frombuffer(raw, dtype="<f4", count=count).astype(np.float64)
    if t == 1:
        return f16(raw[:2 * count])
    if t == 30:
        u = np.frombuffer(raw, dtype="<u2", count=count).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    if t == 8:  # q8_0: blocks of an f16 scale and 32 int8 quants
        b = np.frombuffer(raw, dtype=np.uint8, count=count // 32 * 34).reshape(-1, 34)
        d = f16(b[:, :2].tobytes())
        q = b[:, 2:].view(np.int8).astype(np.float64)
        return (q * d[:, None]).reshape(-1)
    raise SystemExit("grad_reference.py: tensor type %d is not read here" % t)


BYTES = {0: lambda n: 4 * n, 1: lambda n: 2 * n, 30: lambda n: 2 * n, 8: lambda n: n // 32 * 34}


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise SystemExit("grad_reference.py: %s is not a GGUF file" % path)
    r.o = 4
    r.take("<I")
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = r.string()
        meta[k] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (r.o + align - 1) // align * align
    tensors = {}
    for name, dims, t, off in infos:
        count = int(np.prod(dims))
        raw = data[base + off:base + off + BYTES[t](count)]
        shape = list(reversed(dims)) if len(dims) > 1 else [dims[0]]
        tensors[name] = dequantize(t, raw, count).reshape(shape)
    return meta, tensors


# ---- the forward pass, in float64 ------------------------------------------------------------
class Model:
    def __init__(self, path):
        self.meta, self.t = read_gguf(path)
        self.arch = self.meta["general.architecture"]
        a = self.arch
        g = lambda k, d=None: self.meta.get("%s.%s" % (a, k), d)
        self.n_layer, self.d, self.n_head = g("block_count"), g("embedding_length"), g("attention.head_count")
        self.n_head_kv = g("attention.head_count_kv", self.n_head)
        self.hd = g("attention.key_length", self.d // self.n_head)
        self.n_rot = g("rope.dimension_count", self.hd)
        self.base = g("rope.freq_base", 10000.0)
        self.eps = g("attention.layer_norm_rms_epsilon", g("attention.layer_norm_epsilon", 1e-5))
        self.neox = a in ("qwen3", "qwen2", "olmo2", "gptneox", "phi3", "gemma2", "gemma3", "qwen3moe")
        self.n_expert_used = g("expert_used_count", 0)
        self.parallel = g("use_parallel_residual", False)
        self.embd = self.t["token_embd.weight"]
        self.out = self.t.get("output.weight", self.embd)
        self.freqs = self.t.get("rope_freqs.weight")
        # phi3: a sliding window on every layer, LongRoPE's factors (the long ones for a prompt longer
        # than the original context: the gradients' session holds the prompt only), its attention
        # factor multiplying the rotation's cosines and sines, the fused tensors split
        self.window = g("attention.sliding_window", 0) if a == "phi3" else 0
        self.mscale = g("rope.scaling.attn_factor", 1.0)
        self.orig = g("rope.scaling.original_context_length", g("context_length"))
        if a == "phi3":
            self.freqs_short, self.freqs_long = self.t.get("rope_factors_short.weight"), self.t.get(
                "rope_factors_long.weight")
            kv = self.n_head_kv * self.hd
            for l in range(self.n_layer):
                p = "blk.%d." % l
                qkv, gu = self.t.pop(p + "attn_qkv.weight"), self.t.pop(p + "ffn_up.weight")
                self.t[p + "attn_q.weight"], self.t[p + "attn_k.weight"] = qkv[:self.d], qkv[self.d:self.d + kv]
                self.t[p + "attn_v.weight"] = qkv[self.d + kv:]
                ff = gu.shape[0] // 2
                self.t[p + "ffn_gate.weight"], self.t[p + "ffn_up.weight"] = gu[:ff], gu[ff:]

        if a in ("gemma2", "gemma3"):
            self.gemma_config(g)

    def gemma_config(self, g):
        """Gemma 2/3 as llama.cpp reads them: which layers slide (Gemma 2 every other one, Gemma 3 all but
        every sliding_window_pattern-th), their RoPE (Gemma 3's sliding layers: their own base,
        unscaled; global layers: the base with a linear factor), the query scale, the softcaps."""
        a = self.arch
        self.window_size = g("attention.sliding_window", 4096 if a == "gemma2" else 0)
        period = 2 if a == "gemma2" else g("attention.sliding_window_pattern", 6)
        self.slides = [self.window_size > 0 and (period == 0 or l % period != period - 1)
                       for l in range(self.n_layer)]
        linear = g("rope.scaling.type", "linear") == "linear"
        self.rope_global = (self.base, g("rope.scaling.factor", 1.0) if linear else 1.0)
        self.rope_local = (g("rope.freq_base_swa", 10000.0), 1.0) if a == "gemma3" else self.rope_global
        self.attn_cap = g("attn_logit_softcapping", 50.0) if a == "gemma2" else 0.0
        self.final_cap = g("final_logit_softcapping", 30.0 if a == "gemma2" else 0.0)
        wide = {"gemma2": 46, "gemma3": 62}[a] == self.n_layer  # the 27B shapes scale by d / heads
        self.q_scale = 1.0 / np.sqrt(self.d // self.n_head if wide else self.hd)

    def rope_freqs(self, n):
        if self.arch == "phi3":
            return self.freqs_long if n > self.orig else self.freqs_short
        return self.freqs


def rmsnorm(x, w, eps, hold, key):
    """x / rms(x) * w over the last axis; the scale comes from `hold` when frozen."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    r = hold(key, r)
    return x * r * (w if w is not None else 1.0)


def layernorm(x, w, b, eps, hold, key):
    mu = x.mean(axis=-1, keepdims=True)
    r = hold(key, 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps))
    return (x - mu) * r * w + b


def rope(x, n_rot, base, neox, freqs):
    """x (n, heads, hd) at positions 0..n-1: pairs (i, i + n_rot/2) or (2i, 2i + 1)."""
    n, half = x.shape[0], n_rot // 2
    i = np.arange(half)
    freq = base ** (-2.0 * i / n_rot)
    if freqs is not None:
        freq = freq / freqs
    th = np.arange(n)[:, None] * freq[None, :]
    c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
    a_idx, b_idx = (i, i + half) if neox else (2 * i, 2 * i + 1)
    y = x.copy()
    x0, x1 = x[:, :, a_idx], x[:, :, b_idx]
    y[:, :, a_idx] = x0 * c - x1 * s
    y[:, :, b_idx] = x0 * s + x1 * c
    return y


def attention(q, k, v, scale, window, hold, key, edit, cap=0.0):
    """q (n, H, hd), k/v (n, Hkv, hd): causal softmax(q k^T scale) v (the scores capped to
    cap tanh(s / cap) when cap > 0); the pattern (H, n, n) passes through edit (the
    attention_pattern stage) and, when frozen, comes from `hold`."""
    n, H, hd = q.shape
    group = H // k.shape[1]
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("thd,jhd->htj", q, kk) * scale
    if cap > 0:
        s = cap * np.tanh(s / cap)
    t, j = np.arange(n)[:, None], np.arange(n)[None, :]
    mask = (j <= t) & ((j > t - window) if window > 0 else True)
    s = np.where(mask[None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    p = edit(hold(key, p))
    return np.einsum("htj,jhd->thd", p, vv).reshape(n, H * hd)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward_llama(M, ids, edit, hold):
    t, n = M.t, len(ids)
    x = edit("embeddings", -1, M.embd[ids].copy())
    for l in range(M.n_layer):
        p = "blk.%d." % l
        x = edit("before_layer", l, x)
        xn = rmsnorm(x, t[p + "attn_norm.weight"], M.eps, hold, ("attn_norm", l))
        q, k, v = xn @ t[p + "attn_q.weight"].T, xn @ t[p + "attn_k.weight"].T, xn @ t[p + "attn_v.weight"].T
        if p + "attn_q.bias" in t:
            q, k, v = q + t[p + "attn_q.bias"], k + t[p + "attn_k.bias"], v + t[p + "attn_v.bias"]
        q, k, v = q.reshape(n, M.n_head, M.hd), k.reshape(n, M.n_head_kv, M.hd), v.reshape(n, M.n_head_kv, M.hd)
        if p + "attn_q_norm.weight" in t:
            q = rmsnorm(q, t[p + "attn_q_norm.weight"], M.eps, hold, ("q_norm", l))
            k = rmsnorm(k, t[p + "attn_k_norm.weight"], M.eps, hold, ("k_norm", l))
        f = M.rope_freqs(n)
        q, k = rope(q, M.n_rot, M.base, M.neox, f), rope(k, M.n_rot, M.base, M.neox, f)
        q[:, :, :M.n_rot] *= M.mscale
        k[:, :, :M.n_rot] *= M.mscale
        att = attention(q, k, v, 1.0 / np.sqrt(M.hd), M.window, hold, ("attn", l),
                        lambda a: edit("attention_pattern", l, a))
        att = edit("attention_heads", l, att)
        x = x + edit("after_attention", l, att @ t[p + "attn_output.weight"].T)
        xn = rmsnorm(x, t[p + "ffn_norm.weight"], M.eps, hold, ("ffn_norm", l))
        if M.n_expert_used:
            x = x + edit("after_mlp", l, moe(M, l, xn, edit))
        else:
            act = silu(xn @ t[p + "ffn_gate.weight"].T) * (xn @ t[p + "ffn_up.weight"].T)
            act = edit("mlp_activation", l, act)
            x = x + edit("after_mlp", l, act @ t[p + "ffn_down.weight"].T)
        x = edit("after_layer", l, x)
    last = edit("before_logits", -1, rmsnorm(x[-1:], t["output_norm.weight"], M.eps, hold, ("output_norm", -1)))
    return edit("after_logits", -1, last @ M.out.T)[0]


def moe(M, l, xn, edit):
    """qwen3moe's routed experts of layer l over the normed rows xn: the router's logits (the moe_router
    stage), softmax over every expert, the top k (a tie: the lower index), their probabilities over
    their sum (at least 2^-14); each chosen expert's SwiGLU (the mlp_activation stage: slot j of a row
    for its j-th choice) through its down projection, weighted."""
    t, p = M.t, "blk.%d." % l
    r = edit("moe_router", l, xn @ t[p + "ffn_gate_inp.weight"].T)
    prob = np.exp(r - r.max(axis=-1, keepdims=True))
    prob = prob / prob.sum(axis=-1, keepdims=True)
    k, n = M.n_expert_used, xn.shape[0]
    gates, ups, downs = t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"], t[p + "ffn_down_exps.weight"]
    chosen = [sorted(range(prob.shape[1]), key=lambda e: (-prob[i, e], e))[:k] for i in range(n)]
    act = np.concatenate([np.stack([silu(gates[chosen[i][j]] @ xn[i]) * (ups[chosen[i][j]] @ xn[i])
                                    for i in range(n)]) for j in range(k)], axis=1)
    act = edit("mlp_activation", l, act)
    f = act.shape[1] // k
    out = np.zeros_like(xn)
    for i in range(n):
        w = np.array([prob[i, e] for e in chosen[i]])
        w = w / max(w.sum(), 6.103515625e-5)
        for j, e in enumerate(chosen[i]):
            out[i] += w[j] * (downs[e] @ act[i, j * f:(j + 1) * f])
    return out


def forward_gemma(M, ids, edit, hold):
    """Gemma 2 and 3: the embedding scaled by sqrt(hidden), RMSNorm before and after attention and the
    MLP, Gemma 3's per-head QK-norm, NEOX RoPE per layer kind, the softcaps, a tanh-GELU gate."""
    t, n = M.t, len(ids)
    x = edit("embeddings", -1, M.embd[ids].copy()) * float(np.sqrt(np.float32(M.d)))
    for l in range(M.n_layer):
        p = "blk.%d." % l
        x = edit("before_layer", l, x)
        xn = rmsnorm(x, t[p + "attn_norm.weight"], M.eps, hold, ("attn_norm", l))
        q, k, v = xn @ t[p + "attn_q.weight"].T, xn @ t[p + "attn_k.weight"].T, xn @ t[p + "attn_v.weight"].T
        q, k, v = q.reshape(n, M.n_head, M.hd), k.reshape(n, M.n_head_kv, M.hd), v.reshape(n, M.n_head_kv, M.hd)
        if p + "attn_q_norm.weight" in t:
            q = rmsnorm(q, t[p + "attn_q_norm.weight"], M.eps, hold, ("q_norm", l))
            k = rmsnorm(k, t[p + "attn_k_norm.weight"], M.eps, hold, ("k_norm", l))
        base, factor = M.rope_local if M.slides[l] else M.rope_global
        f = factor if factor != 1.0 else None
        q, k = rope(q, M.n_rot, base, True, f), rope(k, M.n_rot, base, True, f)
        att = attention(q, k, v, M.q_scale, M.window_size if M.slides[l] else 0, hold, ("attn", l),
                        lambda a: edit("attention_pattern", l, a), M.attn_cap)
        att = edit("attention_heads", l, att)
        o = rmsnorm(att @ t[p + "attn_output.weight"].T, t[p + "post_attention_norm.weight"], M.eps, hold,
                    ("post_attn_norm", l))
        x = x + edit("after_attention", l, o)
        xn = rmsnorm(x, t[p + "ffn_norm.weight"], M.eps, hold, ("ffn_norm", l))
        act = edit("mlp_activation", l, gelu(xn @ t[p + "ffn_gate.weight"].T) * (xn @ t[p + "ffn_up.weight"].T))
        mo = rmsnorm(act @ t[p + "ffn_down.weight"].T, t[p + "post_ffw_norm.weight"], M.eps, hold, ("post_ffw_norm", l))
        x = x + edit("after_mlp", l, mo)
        x = edit("after_layer", l, x)
    last = edit("before_logits", -1, rmsnorm(x[-1:], t["output_norm.weight"], M.eps, hold, ("output_norm", -1)))
    z = last @ M.out.T
    if M.final_cap > 0:
        z = M.final_cap * np.tanh(z / M.final_cap)
    return edit("after_logits", -1, z)[0]


def forward_gpt2(M, ids, edit, hold):
    t, n, d = M.t, len(ids), M.d
    x = edit("embeddings", -1, M.embd[ids].copy()) + t["position_embd.weight"][:n]
    for l in range(M.n_layer):
        p = "blk.%d." % l
        x = edit("before_layer", l, x)
        xn = layernorm(x, t[p + "attn_norm.weight"], t[p + "attn_norm.bias"], M.eps, hold, ("attn_norm", l))
        qkv = xn @ t[p + "attn_qkv.weight"].T + t[p + "attn_qkv.bias"]
        q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(n, M.n_head, M.hd) for i in range(3))
        att = attention(q, k, v, 1.0 / np.sqrt(M.hd), 0, hold, ("attn", l), lambda a: edit("attention_pattern", l, a))
        att = edit("attention_heads", l, att)
        x = x + edit("after_attention", l, att @ t[p + "attn_output.weight"].T + t[p + "attn_output.bias"])
        xn = layernorm(x, t[p + "ffn_norm.weight"], t[p + "ffn_norm.bias"], M.eps, hold, ("ffn_norm", l))
        act = edit("mlp_activation", l, gelu(xn @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"]))
        x = x + edit("after_mlp", l, act @ t[p + "ffn_down.weight"].T + t[p + "ffn_down.bias"])
        x = edit("after_layer", l, x)
    last = layernorm(x[-1:], t["output_norm.weight"], t["output_norm.bias"], M.eps, hold, ("output_norm", -1))
    last = edit("before_logits", -1, last)
    return edit("after_logits", -1, last @ M.out.T)[0]


def forward_olmo2(M, ids, edit, hold):
    """No pre-norms; RMSNorm after attention and after the MLP; Q/K RMSNorm over the full width."""
    t, n = M.t, len(ids)
    x = edit("embeddings", -1, M.embd[ids].copy())
    for l in range(M.n_layer):
        p = "blk.%d." % l
        x = edit("before_layer", l, x)
        q, k, v = x @ t[p + "attn_q.weight"].T, x @ t[p + "attn_k.weight"].T, x @ t[p + "attn_v.weight"].T
        q = rmsnorm(q, t[p + "attn_q_norm.weight"], M.eps, hold, ("q_norm", l))
        k = rmsnorm(k, t[p + "attn_k_norm.weight"], M.eps, hold, ("k_norm", l))
        q, k, v = q.reshape(n, M.n_head, M.hd), k.reshape(n, M.n_head_kv, M.hd), v.reshape(n, M.n_head_kv, M.hd)
        q, k = rope(q, M.n_rot, M.base, True, None), rope(k, M.n_rot, M.base, True, None)
        att = attention(q, k, v, 1.0 / np.sqrt(M.hd), 0, hold, ("attn", l), lambda a: edit("attention_pattern", l, a))
        att = edit("attention_heads", l, att)
        o = rmsnorm(att @ t[p + "attn_output.weight"].T, t[p + "post_attention_norm.weight"], M.eps, hold,
                    ("post_attn_norm", l))
        x = x + edit("after_attention", l, o)
        act = edit("mlp_activation", l, silu(x @ t[p + "ffn_gate.weight"].T) * (x @ t[p + "ffn_up.weight"].T))
        o = rmsnorm(act @ t[p + "ffn_down.weight"].T, t[p + "post_ffw_norm.weight"], M.eps, hold, ("post_ffw_norm", l))
        x = x + edit("after_mlp", l, o)
        x = edit("after_layer", l, x)
    last = edit("before_logits", -1, rmsnorm(x[-1:], t["output_norm.weight"], M.eps, hold, ("output_norm", -1)))
    return edit("after_logits", -1, last @ M.out.T)[0]


def forward_gptneox(M, ids, edit, hold):
    """LayerNorm with bias, fused QKV, partial NEOX RoPE, GELU MLP; the parallel residual
    x + attn(ln1(x)) + mlp(ln2(x)) when the file says so, else the sequential one."""
    t, n, d = M.t, len(ids), M.d
    kv = M.n_head_kv * M.hd
    x = edit("embeddings", -1, M.embd[ids].copy())
    for l in range(M.n_layer):
        p = "blk.%d." % l
        x = edit("before_layer", l, x)
        xn = layernorm(x, t[p + "attn_norm.weight"], t[p + "attn_norm.bias"], M.eps, hold, ("attn_norm", l))
        qkv = xn @ t[p + "attn_qkv.weight"].T + t[p + "attn_qkv.bias"]
        q = qkv[:, :d].reshape(n, M.n_head, M.hd)
        k, v = (qkv[:, d + i * kv:d + (i + 1) * kv].reshape(n, M.n_head_kv, M.hd) for i in range(2))
        q, k = rope(q, M.n_rot, M.base, True, None), rope(k, M.n_rot, M.base, True, None)
        att = attention(q, k, v, 1.0 / np.sqrt(M.hd), 0, hold, ("attn", l), lambda a: edit("attention_pattern", l, a))
        att = edit("attention_heads", l, att)
        a = edit("after_attention", l, att @ t[p + "attn_output.weight"].T + t[p + "attn_output.bias"])
        h = x if M.parallel else x + a
        xn = layernorm(h, t[p + "ffn_norm.weight"], t[p + "ffn_norm.bias"], M.eps, hold, ("ffn_norm", l))
        act = edit("mlp_activation", l, gelu(xn @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"]))
        x = h + edit("after_mlp", l, act @ t[p + "ffn_down.weight"].T + t[p + "ffn_down.bias"])
        x = x + a if M.parallel else x
        x = edit("after_layer", l, x)
    last = layernorm(x[-1:], t["output_norm.weight"], t["output_norm.bias"], M.eps, hold, ("output_norm", -1))
    last = edit("before_logits", -1, last)
    return edit("after_logits", -1, last @ M.out.T)[0]


FORWARDS = {"llama": forward_llama, "qwen3": forward_llama, "qwen2": forward_llama, "gpt2": forward_gpt2,
            "olmo2": forward_olmo2, "gptneox": forward_gptneox, "phi3": forward_llama, "gemma2": forward_gemma,
            "gemma3": forward_gemma, "qwen3moe": forward_llama}


# ---- metric, frozen values, finite differences -------------------------------------------------
def metric(m, z):
    kind = m["kind"]
    if kind == "logit":
        return z[m["a"]]
    if kind == "logit-diff":
        return z[m["a"]] - z[m["b"]]
    lse = z.max() + np.log(np.exp(z - z.max()).sum())
    if kind == "logprob":
        return z[m["a"]] - lse
    if kind == "prob":
        return np.exp(z[m["a"]] - lse)
    raise SystemExit("grad_reference.py: metric %s is not computed here" % kind)


class Pass:
    """One model and prompt: the base pass records what frozen modes hold."""

    def __init__(self, M, ids, m, freeze):
        self.M, self.ids, self.m, self.freeze, self.held = M, ids, m, set(freeze), {}
        fwd = FORWARDS[M.arch]
        self.fwd = fwd
        self.recording = True
        self.base_logits = fwd(M, ids, lambda s, l, a: a, self.hold)
        self.recording = False

    def hold(self, key, value):
        kind = "attention" if key[0] == "attn" else "norm"
        if kind not in self.freeze:
            return value
        if self.recording:
            self.held[key] = value
            return value
        return self.held[key]

    def run(self, stage, layer, delta):
        """The metric with `delta` added to (stage, layer)'s activation."""

        def edit(s, l, a):
            if s == stage and l == layer:
                return a + delta.reshape(a.shape)
            return a

        return metric(self.m, self.fwd(self.M, self.ids, edit, self.hold))

    def fd(self, stage, layer, direction, h):
        return (self.run(stage, layer, h * direction) - self.run(stage, layer, -h * direction)) / (2 * h)


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack_from("<Q", data, 0)[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype="<f4").astype(np.float64).reshape(info["shape"])
    return out


def main():
    req = json.load(open(sys.argv[1]))
    M = Model(req["model"])
    P = Pass(M, req["ids"], req["metric"], req.get("freeze", []))
    rng = np.random.default_rng(req.get("seed", 1))
    ember_logits = read_safetensors(req["logits"])["logits"].reshape(-1)
    out = {"logits_rel": float(np.abs(ember_logits - P.base_logits).max() / np.abs(P.base_logits).max()),
           "checks": []}
    grads = read_safetensors(req["gradients"])
    h = req.get("step", 1e-4)
    for name in sorted(grads):
        g = grads[name]
        stage, layer = (name.rsplit(".", 1) + ["-1"])[:2] if "." in name else (name, "-1")
        layer = int(layer)
        scale = float(np.abs(g).max())
        flat = g.reshape(-1)
        picks = [int(np.abs(flat).argmax())] + list(rng.choice(flat.size, size=min(req.get("samples", 3), flat.size),
                                                               replace=False))
        coord_rel = 0.0
        for i in picks:
            e = np.zeros(flat.size)
            e[i] = 1.0
            coord_rel = max(coord_rel, abs(P.fd(stage, layer, e, h) - flat[i]) / max(scale, 1e-30))
        u = rng.standard_normal(flat.size)
        dir_fd = P.fd(stage, layer, u, h)
        dir_rel = abs(dir_fd - float(flat @ u)) / max(float(np.abs(flat * u).sum()), 1e-30)
        out["checks"].append({"stage": stage, "layer": layer, "coord_rel": coord_rel, "dir_rel": dir_rel,
                              "scale": scale})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
