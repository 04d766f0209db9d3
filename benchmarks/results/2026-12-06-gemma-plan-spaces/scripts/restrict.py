"""As run: python restrict.py PROFILE_CSV OUT_CSV (--key-floor B | --layouts K_LAYOUT V_LAYOUT): the nine-window
profile's cells with only the keys of at least B bits, or only the keys and values of one layout each (the scheme's
name less its `int<b>_`), for ../../2026-12-06-gemma-6-windows/diagnosis/profile_from_csv.py to make a profile of."""
import argparse
import re

import pandas as pd

ap = argparse.ArgumentParser()
ap.add_argument("profile_csv")
ap.add_argument("out_csv")
ap.add_argument("--key-floor", type=int)
ap.add_argument("--layouts", nargs=2, metavar=("K", "V"))
a = ap.parse_args()
t = pd.read_csv(a.profile_csv)
bits = t.scheme.map(lambda s: int(re.match(r"int(\d+)", s).group(1)))
layout = t.scheme.map(lambda s: re.sub(r"^int\d+_", "", s))
if a.key_floor is not None:
    keep = (t.tensor != "K") | (bits >= a.key_floor)
else:
    keep = ((t.tensor == "K") & (layout == a.layouts[0])) | ((t.tensor == "V") & (layout == a.layouts[1]))
t[keep].to_csv(a.out_csv, index=False)
print(f"{int(keep.sum())} of {len(t)} cells -> {a.out_csv}")
