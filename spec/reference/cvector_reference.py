#!/usr/bin/python3
# cvector_reference.py — the directions of a control vector in float64, from the hidden states
# written by spec/control_vector_spec.lua: per layer, the positive minus the negative rows of each
# pair, rows whose every |value| <= 1e-6 dropped, then the mean (normalized) and the first right
# singular vector of the difference matrix (uncentred), signed to agree with the mean.
#
#   cvector_reference.py MANIFEST.json   prints {"LAYER": {"rows": n, "mean": [...], "pca": [...]}}
#   MANIFEST: {"d": d, "layers": [..], "pairs": [{"rows": T, "pos": {"L": file}, "neg": {"L": file}}]}
#   each file: T x d little-endian f32 values, row-major
import json, sys
import numpy as np

man = json.load(open(sys.argv[1]))
d = man["d"]
out = {}
for layer in man["layers"]:
    key = str(layer)
    rows = []
    for p in man["pairs"]:
        a = np.fromfile(p["pos"][key], dtype="<f4").reshape(p["rows"], d).astype(np.float64)
        b = np.fromfile(p["neg"][key], dtype="<f4").reshape(p["rows"], d).astype(np.float64)
        diff = a - b
        rows.append(diff[np.abs(diff).max(axis=1) > 1e-6])
    D = np.concatenate(rows)
    mean = D.mean(axis=0)
    mean /= np.linalg.norm(mean)
    _, s, vt = np.linalg.svd(D, full_matrices=False)
    pca = vt[0] / np.linalg.norm(vt[0])
    if pca @ mean < 0:
        pca = -pca
    gap = float(s[1] / s[0]) if len(s) > 1 else 0.0
    out[key] = {"rows": int(D.shape[0]), "mean": mean.tolist(), "pca": pca.tolist(), "gap": gap}
json.dump(out, sys.stdout)
