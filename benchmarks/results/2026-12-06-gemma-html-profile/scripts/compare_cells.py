"""Each scheme's KL summed over the 18 layers on the HTML page's cells (../profile.csv) and on the nine-window mixture's
(../../2026-12-06-gemma-9-windows/profile.csv), and the per-layer ratio HTML / mixture: which cells does HTML price
differently? No model run.

    python scripts/compare_cells.py [OUT]   (default cells_html_over_mixture.csv; run in this folder)
"""
import os
import sys

import pandas as pd

here = os.path.dirname(os.path.abspath(__file__))
html = pd.read_csv(os.path.join(here, "..", "profile.csv"))
mix = pd.read_csv(os.path.join(here, "..", "..", "2026-12-06-gemma-9-windows", "profile.csv"))
key = ["layer", "layer_kind", "tensor", "scheme", "bits"]
both = html.merge(mix, on=key, suffixes=("_html", "_mixture"))
rows = []
for (tensor, scheme), g in both.groupby(["tensor", "scheme"]):
    g = g.sort_values("layer")
    ratio = g.kl_html / g.kl_mixture
    rows.append({"tensor": tensor, "scheme": scheme, "bits": g.bits.iloc[0], "sum_html": g.kl_html.sum(),
                 "sum_mixture": g.kl_mixture.sum(), "sum_ratio": g.kl_html.sum() / g.kl_mixture.sum(),
                 "layers_above_2x": int((ratio > 2).sum()), "max_layer_ratio": ratio.max(),
                 "per_layer_ratio": " ".join(f"{r:.2f}" for r in ratio)})
out = pd.DataFrame(rows).sort_values(["tensor", "bits", "scheme"])
path = sys.argv[1] if len(sys.argv) > 1 else "cells_html_over_mixture.csv"
out.to_csv(path, index=False)
with pd.option_context("display.width", 200, "display.max_colwidth", 30):
    print(out.drop(columns="per_layer_ratio").to_string(index=False, float_format=lambda v: f"{v:.3g}"))
