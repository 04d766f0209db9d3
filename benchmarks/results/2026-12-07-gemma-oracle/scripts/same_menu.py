"""As run: python same_menu.py PROFILE_CSV ORACLE_PROFILE_DIR OUT_CSV: the cells of PROFILE_CSV (the nine-window
mixture profile's table) whose scheme is in the oracle profile's menu, so both plan in the same space."""
import json
import os
import sys

import pandas as pd

src, oracle, out = sys.argv[1:]
with open(os.path.join(oracle, "meta.json")) as f:
    settings = json.load(f)["settings"]
menu = {"K": set(settings["k_schemes"]), "V": set(settings["v_schemes"])}
t = pd.read_csv(src)
keep = [s in menu[k] for k, s in zip(t.tensor, t.scheme)]
t[keep].to_csv(out, index=False)
print(f"{sum(keep)} of {len(t)} cells -> {out}")
