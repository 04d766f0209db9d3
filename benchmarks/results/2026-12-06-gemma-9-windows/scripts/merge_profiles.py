"""One profile.csv of N1 + N2 windows from two profiles of the same cells on disjoint windows.

    python merge_profiles.py A.csv N1 B.csv N2 OUT.csv

Every per-window mean (kl, dnll, attn_kl, out_rel_l2) is the windows-weighted mean; kl_std is the sample standard
deviation over all N1 + N2 windows, rebuilt from each part's mean and sample standard deviation. Refuses profiles whose
cells differ."""
import argparse

import numpy as np
import pandas as pd

ap = argparse.ArgumentParser()
ap.add_argument("a"); ap.add_argument("na", type=int); ap.add_argument("b"); ap.add_argument("nb", type=int)
ap.add_argument("out")
args = ap.parse_args()
key = ["layer", "layer_kind", "tensor", "scheme", "bits"]
a, b = pd.read_csv(args.a), pd.read_csv(args.b)
if sorted(map(tuple, a[key].values.tolist())) != sorted(map(tuple, b[key].values.tolist())):
    raise SystemExit("the two profiles hold different cells; merge profiles of the same menus and layers")
m = a.merge(b, on=key, suffixes=("_a", "_b"), sort=False)
n1, n2 = args.na, args.nb
n = n1 + n2
out = m[key].copy()
for col in ("kl", "dnll", "attn_kl", "out_rel_l2"):
    out[col] = (n1 * m[f"{col}_a"] + n2 * m[f"{col}_b"]) / n
squares = ((n1 - 1) * m.kl_std_a ** 2 + n1 * m.kl_a ** 2) + ((n2 - 1) * m.kl_std_b ** 2 + n2 * m.kl_b ** 2)
out["kl_std"] = np.sqrt(np.maximum(squares - n * out.kl ** 2, 0.0) / (n - 1))
out["measured"] = m.measured_a & m.measured_b
out[a.columns.tolist()].to_csv(args.out, index=False)
print(f"{len(out)} cells, {n} windows -> {args.out}")
