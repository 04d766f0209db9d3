"""A plannable profile folder from a results folder's committed profile.csv (the profile folder itself is not kept).

    python profile_from_csv.py TINY PROFILE_CSV OUT [--fit median|mean] [--windows N] [--seq-len L]

TINY is any complete profile of the same model (e.g. `sensprof profile --model gemma3-270m --seq-len 128 --windows 1
--k-schemes int8_c32 --v-schemes int8_t32 --out TINY`, 20 s): its meta gives the model and layers; the menus, the
windows and the length are set from the CSV and the arguments. `sensprof plan OUT ...` then gives the plans the
original profile gave (checked: Gemma's 4-bit plan of ../../2026-12-05-gemma-c128-t32, layer for layer). --fit
replaces each integer cell by its layout's fit across bit widths (fit_across_bits.py)."""
import argparse, json, shutil

import pandas as pd

from sensprof.schemes import get_scheme

ap = argparse.ArgumentParser()
ap.add_argument("tiny"); ap.add_argument("csv"); ap.add_argument("out")
ap.add_argument("--fit", choices=("median", "mean")); ap.add_argument("--windows", type=int, default=3)
ap.add_argument("--seq-len", type=int, default=1024)
a = ap.parse_args()
shutil.rmtree(a.out, ignore_errors=True)
shutil.copytree(a.tiny, a.out)
shutil.rmtree(f"{a.out}/parts", ignore_errors=True)
df = pd.read_csv(a.csv)
if a.fit:
    from fit_across_bits import smooth
    df = smooth(df, a.fit)
df.to_csv(f"{a.out}/profile.csv", index=False)
m = json.load(open(f"{a.out}/meta.json"))
ks = list(dict.fromkeys(df[df.tensor == "K"].scheme)); vs = list(dict.fromkeys(df[df.tensor == "V"].scheme))
m["settings"].update(seq_len=a.seq_len, windows=a.windows, k_schemes=ks, v_schemes=vs, kl="sampled")
head_dim = str(m["layers"][0]["head_dim"])
m["schemes"] = {s: {"bits_per_element": {head_dim: float(df[df.scheme == s].bits.iloc[0])},
                    "description": get_scheme(s).description, "revision": 1} for s in ks + vs}
m["window_slots"] = list(range(a.windows))
json.dump(m, open(f"{a.out}/meta.json", "w"))
