#!/usr/bin/python3
# dla_reference.py — the residual stream taken apart, in float64 from what a cache saved, for
# spec/activation_cache_spec.lua: each head through its slice of W_O, the components through the
# final norm with the final residual's scale frozen at one position, and their direct logit
# attributions. Reads safetensors files with NumPy alone; writes .npy files (f32).
#
#   dla_reference.py CACHE.safetensors WEIGHTS.safetensors OUTDIR N_LAYERS N_HEADS POS EPS rms|layer
#
# CACHE: ember.save_tensors(path, cache) of resid_pre, z, attn_out, mlp_out and resid_post (names as
# in TransformerLens). WEIGHTS: norm_w [1, d] (norm_b for layer), wu [T, d] (the LM head's rows of
# the tokens), wu_incorrect [T, d], w_o.L [d, n_heads * head_dim].
import json, os, struct, sys
import numpy as np


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    header.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype="<f4")
            .reshape(v["shape"]).astype(np.float64) for k, v in header.items()}


cache, w = read(sys.argv[1]), read(sys.argv[2])
out, n_layers, n_heads, pos = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
eps, kind = float(sys.argv[7]), sys.argv[8]

comps = [cache["blocks.0.hook_resid_pre"]]
for l in range(n_layers):
    comps += [cache[f"blocks.{l}.hook_attn_out"], cache[f"blocks.{l}.hook_mlp_out"]]
final = cache[f"blocks.{n_layers - 1}.hook_resid_post"]

heads = []
for l in range(n_layers):
    z, w_o = cache[f"blocks.{l}.attn.hook_z"], w[f"w_o.{l}"]
    hd = z.shape[1] // n_heads
    heads += [z[:, h * hd:(h + 1) * hd] @ w_o[:, h * hd:(h + 1) * hd].T for h in range(n_heads)]

x = final[pos]
if kind == "rms":
    scale, centre = 1.0 / np.sqrt(np.mean(x * x) + eps), lambda c: c
else:
    scale, centre = 1.0 / np.sqrt(np.var(x) + eps), lambda c: c - c.mean()
normed = np.stack([centre(c[pos]) * scale * w["norm_w"][0] for c in comps])
full = centre(x) * scale * w["norm_w"][0] + (w["norm_b"][0] if kind == "layer" else 0.0)

results = {
    "sum": sum(comps),  # the decomposition, summed
    "heads": np.concatenate(heads),
    "normed": normed,
    "attrs": normed @ w["wu"].T,
    "diff": normed @ (w["wu"] - w["wu_incorrect"]).T,
    "logits": (full @ w["wu"].T)[None, :],  # the head on the whole normed residual
}
for name, a in results.items():  # computed in float64, stored as the f32 the spec reads
    np.save(os.path.join(out, name + ".npy"), a.astype("<f4"))
