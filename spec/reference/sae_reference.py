#!/usr/bin/python3
# sae_reference.py — synthetic SAEs in the files of SAELens, Gemma Scope and Llama Scope, written
# here (json + struct + numpy, independently of ember's readers), and their encode and decode in
# float64 from the weights as stored. ember's results are checked against these (spec/sae_spec.lua).
#
#   sae_reference.py OUTDIR CASE...   writes, for each case, OUTDIR/CASE/sae/... (the SAE files),
#                                     OUTDIR/CASE/x.npy (the f32 inputs) and OUTDIR/CASE/expect.json
#                                     ({"f": features, "out": reconstruction, "active": ..., ...})
#   sae_reference.py OUTDIR --x X.npy CASE...   the same with the inputs of X.npy (rows x 64 f32,
#                                     e.g. a model's activations) instead of random ones
import json, struct, sys, os
import numpy as np

ROWS, D_IN, D_SAE = 5, 64, 256

CASES = {
    # name: format, architecture, dtype, cfg style, normalisation, extras
    "saelens_standard_pre6": dict(fmt="saelens", arch="standard", dtype="f32", style="pre6", sparsity=True),
    "saelens_standard_v6": dict(fmt="saelens", arch="standard", dtype="f32", style="v6", b_dec_in=False),
    "saelens_jumprelu_v6": dict(fmt="saelens", arch="jumprelu", dtype="f32", style="v6"),
    "saelens_jumprelu_log_bf16": dict(fmt="saelens", arch="jumprelu", dtype="bf16", style="pre6", log_threshold=True),
    "saelens_topk_f16": dict(fmt="saelens", arch="topk", dtype="f16", style="v6", k=16, ties=True),
    "saelens_topk_pre6": dict(fmt="saelens", arch="topk", dtype="f32", style="pre6", k=8),
    "saelens_gated": dict(fmt="saelens", arch="gated", dtype="f32", style="v6"),
    "saelens_constant_norm": dict(fmt="saelens", arch="standard", dtype="f32", style="v6",
                                  norm="constant_norm_rescale"),
    "saelens_layer_norm": dict(fmt="saelens", arch="standard", dtype="f32", style="v6", norm="layer_norm"),
    "saelens_expected_average": dict(fmt="saelens", arch="jumprelu", dtype="f32", style="v6",
                                     norm="expected_average_only_in", factor=0.75),
    "saelens_scaling_factor": dict(fmt="saelens", arch="standard", dtype="f32", style="pre6", scaling=True),
    "saelens_transcoder": dict(fmt="saelens", arch="transcoder", dtype="f32", style="v6", d_out=48),
    # one that fits the tiny models (64 wide): the residual entering layer 1 -> that layer's MLP output
    "saelens_transcoder_model": dict(fmt="saelens", arch="transcoder", dtype="f32", style="v6", d_out=64,
                                     hook="blocks.1.hook_resid_pre", hook_out="blocks.1.hook_mlp_out"),
    # x = relu(x) - relu(-x) exactly: features 0-63 and 64-127 reconstruct any input, 128-255 never
    # fire (the evaluation's exact case: zero KL, all the variance explained)
    "saelens_identity": dict(fmt="saelens", arch="standard", dtype="f32", style="v6", identity=True),
    # attn.hook_z of the tiny llama (4 heads of 16): all heads, W_enc stored [4, 16, d_sae] and W_dec
    # [d_sae, 4, 16] (reshape_activations = hook_z); one head's 16 columns (hook_head_index)
    "saelens_hook_z": dict(fmt="saelens", arch="standard", dtype="f32", style="v6", hook="blocks.1.attn.hook_z",
                           reshape=(4, 16)),
    "saelens_hook_z_head": dict(fmt="saelens", arch="standard", dtype="f32", style="v6", d_in=16, head=2,
                                hook="blocks.1.attn.hook_z"),
    "gemma_scope": dict(fmt="gemma", arch="jumprelu", dtype="f32"),
    "gemma_scope_compressed": dict(fmt="gemma", arch="jumprelu", dtype="f32", compressed=True),
    "llama_scope": dict(fmt="llama", arch="jumprelu", dtype="bf16", norm="expected_average_only_in"),
}

def bf16_round(a):
    """f32 -> the nearest bf16 (round to nearest even), as f32 values and as the 16-bit patterns."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return (r.astype(np.uint32) << 16).view(np.float32), r

def stored(a, dtype):
    """(the values as the file holds them, exact in float64; raw bytes; safetensors dtype name)"""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "f32":
        return a.astype(np.float64), a.tobytes(), "F32"
    if dtype == "f16":
        h = a.astype(np.float16)
        return h.astype(np.float64), h.tobytes(), "F16"
    v, r = bf16_round(a)
    return v.astype(np.float64), r.tobytes(), "BF16"

def write_safetensors(path, tensors):
    """tensors: [(name, shape, raw bytes, dtype name)] in data order (the format's documented layout)."""
    header, offset = {}, 0
    for name, shape, raw, dt in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[2] for t in tensors))

def margin_ok(v, edge, eps=1e-3):
    return np.all(np.abs(v - edge) > eps)

def make(case, rng, given=None):
    c = dict(CASES[case])
    d_in = c.get("d_in", D_IN)
    d_out = c.get("d_out", d_in)
    x = rng.standard_normal((ROWS, d_in)).astype(np.float32) * 2 + 0.5
    if given is not None:
        x = given
    W_enc = rng.standard_normal((d_in, D_SAE)).astype(np.float32) / 8
    W_dec = rng.standard_normal((D_SAE, d_out)).astype(np.float32) / 8
    b_enc = rng.standard_normal(D_SAE).astype(np.float32) / 4
    b_dec = rng.standard_normal(d_out).astype(np.float32) / 4
    if c.get("identity"):
        eye = np.eye(D_IN, dtype=np.float32)
        W_enc = np.zeros((D_IN, D_SAE), dtype=np.float32)
        W_enc[:, :D_IN], W_enc[:, D_IN:2 * D_IN] = eye, -eye
        W_dec[:D_IN], W_dec[D_IN:2 * D_IN] = eye, -eye
        b_enc = np.where(np.arange(D_SAE) < 2 * D_IN, 0, -1).astype(np.float32)
        b_dec = np.zeros(d_out, dtype=np.float32)
    if c.get("ties"):  # exact ties: features 10 and 3 share a column (and bias), as do 200 and 7
        for a, b in ((10, 3), (200, 7)):
            W_enc[:, a] = W_enc[:, b]
            b_enc[a] = b_enc[b]
    return c, d_out, x, W_enc, W_dec, b_enc, b_dec

def row_norm(c, x):
    """(sub, mul, dmul, dadd) per row in float64, as docs/sae.md gives them."""
    n = x.shape[1]
    norm = c.get("norm", "none")
    one = np.ones((x.shape[0], 1))
    if norm == "constant_norm_rescale":
        mul = np.sqrt(n) / np.linalg.norm(x, axis=1, keepdims=True)
        return 0 * one, mul, 1 / mul, 0 * one
    if norm == "layer_norm":
        mu = x.mean(axis=1, keepdims=True)
        sd = (x - mu).std(axis=1, ddof=1, keepdims=True)
        return mu, 1 / (sd + 1e-5), sd, mu
    if norm == "expected_average_only_in":
        return 0 * one, c["scale_in"] * one, one / c["scale_out"], 0 * one
    return 0 * one, one, one, 0 * one

def reference(c, x, w):
    x = x.astype(np.float64)
    sub, mul, dmul, dadd = row_norm(c, x)
    xin = (x - sub) * mul
    if c["apply_b_dec"]:
        xin = xin - w["b_dec"]
    h = xin @ w["W_enc"]
    arch = c["act"]
    if arch == "gated":
        pre = h * np.exp(w["r_mag"]) + w["b_mag"]
        f = np.where((h + w["b_gate"] > 0) & (pre > 0), pre, 0.0)
        edges = [(h + w["b_gate"], 0.0)]
    else:
        pre = h + w["b_enc"]
        if arch == "standard":
            f = np.maximum(pre, 0)
        elif arch == "jumprelu":
            f = np.where((pre > w["threshold"]) & (pre > 0), pre, 0.0)
        else:  # topk: the k largest, lower index first on ties, then relu
            f = np.zeros_like(pre)
            for r in range(pre.shape[0]):
                order = sorted(range(pre.shape[1]), key=lambda i: (-pre[r, i], i))[: c["k"]]
                f[r, order] = np.maximum(pre[r, order], 0)
        edges = [(pre, w["threshold"])] if arch == "jumprelu" else []
    fs = f * w["scaling"] if "scaling" in w else f
    out = (fs @ w["W_dec"] + w["b_dec"]) * (dmul if c["denorm"] else 1) + (dadd if c["denorm"] else 0)
    return f, out, pre, edges

def cfg_fields(c, d_out, hook):
    arch_name = c["arch"]
    cfg = {"d_in": c.get("d_in", D_IN), "d_sae": D_SAE, "dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[c["dtype"]],
           "device": "cpu"}
    meta = {"model_name": "tiny-llama", "hook_name": hook, "hook_layer": 1, "hook_head_index": c.get("head"),
            "prepend_bos": True, "sae_lens_version": "6.5.1"}
    if c["style"] == "pre6":
        cfg.update({"hook_point": hook, "hook_point_layer": 1, "hook_point_head_index": None,
                    "model_name": "tiny-llama", "sae_lens_version": "3.12.0"})
        if c["arch"] == "topk":
            arch_name = "standard"
            cfg["activation_fn_str"] = "topk"
            cfg["activation_fn_kwargs"] = {"k": c["k"]}
        else:
            cfg["activation_fn_str"] = "relu"
        if c.get("scaling"):
            cfg["finetuning_scaling_factor"] = True
    else:
        cfg["metadata"] = meta
        if c["arch"] == "topk":
            cfg["k"] = c["k"]
    cfg["architecture"] = arch_name
    if c.get("b_dec_in") is False:
        cfg["apply_b_dec_to_input"] = False
    if "norm" in c:
        cfg["normalize_activations"] = c["norm"]
    if c.get("reshape"):
        cfg["reshape_activations"] = "hook_z"
    if c.get("factor"):
        cfg["norm_scaling_factor"] = c["factor"]
    if c["arch"] == "transcoder":
        cfg["d_out"] = d_out
        cfg["hook_name_out"] = c.get("hook_out", "blocks.1.hook_mlp_out")
        cfg["hook_layer_out"] = 1
    return cfg

def write_saelens(c, out, d_out, W_enc, W_dec, b_enc, b_dec, rng):
    os.makedirs(out)
    dt = c["dtype"]
    w, raw = {}, []
    def put(name, a, dtype=dt):
        v, b, name_dt = stored(a, dtype)
        w[name] = v
        raw.append((name, a.shape, b, name_dt))
    if c.get("reshape"):  # stored per head, read flat
        put("W_enc", W_enc.reshape(c["reshape"] + (D_SAE,)))
        put("W_dec", W_dec.reshape((D_SAE,) + c["reshape"]))
        w["W_enc"], w["W_dec"] = w["W_enc"].reshape(W_enc.shape), w["W_dec"].reshape(W_dec.shape)
    else:
        put("W_enc", W_enc)
        put("W_dec", W_dec)
    put("b_dec", b_dec)
    c["act"] = {"transcoder": "standard"}.get(c["arch"], c["arch"])
    if c["arch"] == "gated":
        put("b_gate", rng.standard_normal(D_SAE).astype(np.float32) / 4)
        put("b_mag", rng.standard_normal(D_SAE).astype(np.float32) / 4)
        put("r_mag", rng.standard_normal(D_SAE).astype(np.float32) / 4)
    else:
        put("b_enc", b_enc)
    if c["arch"] == "jumprelu":
        thr = np.abs(rng.standard_normal(D_SAE).astype(np.float32)) / 4
        if c.get("log_threshold"):
            put("log_threshold", np.log(thr), "f32")
            w["threshold"] = np.exp(w.pop("log_threshold"))
        else:
            put("threshold", thr, "f32")
    if c.get("scaling"):
        put("scaling_factor", (1 + rng.random(D_SAE) / 2).astype(np.float32), "f32")
        w["scaling"] = w.pop("scaling_factor")
    c["apply_b_dec"] = c["arch"] != "transcoder" and c.get("b_dec_in", True)
    c["denorm"] = c["arch"] != "transcoder"
    hook = c.get("hook", "blocks.1.hook_mlp_in" if c["arch"] == "transcoder" else "blocks.1.hook_resid_post")
    cfg = cfg_fields(c, d_out, hook)
    if c.get("factor"):
        c["scale_in"] = c["scale_out"] = c["factor"]
    with open(os.path.join(out, "cfg.json"), "w") as f:
        json.dump(cfg, f)
    write_safetensors(os.path.join(out, "sae_weights.safetensors"), raw)
    if c.get("sparsity"):  # SAELens' optional log10 firing rates
        ls = np.log10(rng.random(D_SAE) + 1e-6).astype(np.float32)
        write_safetensors(os.path.join(out, "sparsity.safetensors"), [("sparsity", ls.shape, ls.tobytes(), "F32")])
        c["log_sparsity"] = ls
    return w

def write_gemma(c, out, W_enc, W_dec, b_enc, b_dec, rng):
    os.makedirs(out)
    thr = np.abs(rng.standard_normal(D_SAE).astype(np.float32)) / 4
    arrays = dict(W_enc=W_enc, W_dec=W_dec, b_enc=b_enc, b_dec=b_dec, threshold=thr)
    (np.savez_compressed if c.get("compressed") else np.savez)(os.path.join(out, "params.npz"), **arrays)
    c.update(act="jumprelu", apply_b_dec=False, denorm=True)
    return {k: v.astype(np.float64) for k, v in arrays.items()}

def write_llama(c, out, W_enc, W_dec, b_enc, b_dec):
    os.makedirs(os.path.join(out, "checkpoints"))
    thr = 0.125
    avg_in, avg_out = 9.5, 11.0
    hp = {"d_model": D_IN, "d_sae": D_SAE, "hook_point_in": "blocks.1.hook_resid_post",
          "hook_point_out": "blocks.1.hook_resid_post", "act_fn": "jumprelu", "jump_relu_threshold": thr,
          "norm_activation": "dataset-wise", "dataset_average_activation_norm": {"in": avg_in, "out": avg_out},
          "apply_decoder_bias_to_pre_encoder": False, "top_k": 50}
    with open(os.path.join(out, "hyperparams.json"), "w") as f:
        json.dump(hp, f)
    w, raw = {}, []
    for name, key, a in (("encoder.weight", "W_enc", W_enc.T), ("encoder.bias", "b_enc", b_enc),
                         ("decoder.weight", "W_dec", W_dec.T), ("decoder.bias", "b_dec", b_dec)):
        v, b, dt = stored(a, "bf16")
        w[key] = v
        raw.append((name, a.shape, b, dt))
    w["W_enc"], w["W_dec"] = w["W_enc"].T, w["W_dec"].T
    w["threshold"] = np.full(D_SAE, thr)
    write_safetensors(os.path.join(out, "checkpoints", "final.safetensors"), raw)
    c.update(act="jumprelu", apply_b_dec=False, denorm=True, norm="expected_average_only_in",
             scale_in=np.sqrt(D_IN) / avg_in, scale_out=np.sqrt(D_IN) / avg_out)
    return w

def write_case(case, out, given=None):
    rng = np.random.default_rng(sum(map(ord, case)))
    for attempt in range(50):  # keep every jump and top-k boundary 1e-3 away from the inputs
        c, d_out, x, W_enc, W_dec, b_enc, b_dec = make(case, rng, given)
        rows = x.shape[0]
        sae = os.path.join(out, "sae")
        if os.path.exists(sae):
            import shutil; shutil.rmtree(sae)
        if c["fmt"] == "saelens":
            w = write_saelens(c, sae, d_out, W_enc, W_dec, b_enc, b_dec, rng)
        elif c["fmt"] == "gemma":
            w = write_gemma(c, sae, W_enc, W_dec, b_enc, b_dec, rng)
        else:
            w = write_llama(c, sae, W_enc, W_dec, b_enc, b_dec)
        f, o, pre, edges = reference(c, x, w)
        ok = all(margin_ok(v, e) for v, e in edges) and margin_ok(pre, 0.0, 1e-4)
        if c["act"] == "topk":
            for r in range(rows):
                s = np.sort(np.unique(pre[r]))[::-1]
                ok = ok and s[c["k"] - 1] - s[c["k"]] > 1e-3
        if ok:
            break
    else:
        raise SystemExit("no margin after 50 draws")
    np.save(os.path.join(out, "x.npy"), x)
    with open(os.path.join(out, "expect.json"), "w") as fh:
        doc = {"rows": rows, "d_in": x.shape[1], "d_sae": D_SAE, "d_out": d_out, "f": f.ravel().tolist(),
               "out": o.ravel().tolist(), "active": [np.nonzero(f[r])[0].tolist() for r in range(rows)],
               "sae": "sae"}
        if "log_sparsity" in c:
            doc["log_sparsity"] = c["log_sparsity"].tolist()
        json.dump(doc, fh)

if __name__ == "__main__":
    names, given = sys.argv[2:], None
    if names[:1] == ["--x"]:
        given = np.load(names[1]).astype(np.float32)
        if given.ndim != 2 or given.shape[1] != D_IN:
            raise SystemExit("--x: %s must be rows x %d, got %s" % (names[1], D_IN, given.shape))
        names = names[2:]
    for name in names or CASES:
        write_case(name, os.path.join(sys.argv[1], name), given)
