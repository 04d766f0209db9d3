"""Each integer cell replaced by its layout's fit across bit widths: KL = A / (2^b - 1)^2 (the squared step of a b-bit
grid), A the median (or mean) over the layout's bit widths of KL * (2^b - 1)^2, in logs. Tried in
../README.md ("Fitting cells across bit widths"); not in sensprof.

    python fit_across_bits.py PROFILE_CSV   # a few layers' cells beside their fits
"""
import math
import sys

import numpy as np
import pandas as pd

from sensprof.schemes import get_scheme


def layout(name: str):
    """(format, every field of the scheme but its bits): the cells one fit covers."""
    import dataclasses

    fields = dataclasses.asdict(get_scheme(name))
    for key in ("bits", "name", "description"):
        fields.pop(key)
    return fields["format"], tuple(sorted(fields.items()))


def smooth(df: pd.DataFrame, how: str = "median", col: str = "kl") -> pd.DataFrame:
    df = df.copy()
    out = df[col].astype(float).copy()
    groups = {}
    for i, r in df.iterrows():
        fmt, key = layout(r.scheme)
        if fmt == "int":
            groups.setdefault((r.layer, r.tensor, key), []).append(i)
    for idx in groups.values():
        if len(idx) < 3:
            continue
        bits = np.array([get_scheme(df.scheme[i]).bits for i in idx])
        kl = np.array([max(df[col][i], 1e-12) for i in idx])
        log_a = np.log(kl) + 2 * np.log(2.0 ** bits - 1)
        a = np.median(log_a) if how == "median" else np.mean(log_a)
        for i, b in zip(idx, bits):
            out[i] = math.exp(a) / (2.0 ** b - 1) ** 2
    df[col] = out
    return df


if __name__ == "__main__":
    df = pd.read_csv(sys.argv[1])
    for layer, tensor in [(0, "K"), (5, "K"), (11, "V"), (2, "V")]:
        cells = df[(df.layer == layer) & (df.tensor == tensor)].reset_index(drop=True)
        fitted = smooth(cells)
        print(layer, tensor)
        print(pd.DataFrame({"scheme": cells.scheme, "kl": cells.kl, "fit": fitted.kl}).sort_values("scheme")
              .to_string(index=False))
