"""Cell-level cross-fitting: plans made from three of the six windows, scored on the other three (no model run).

    python cross_fit.py TINY OLD_PROFILE_CSV PS6_PROFILE_CSV WORK_DIR

The six-window profile's first window of each kind is the three-window profile's window, so a cell's mean over the
other three is 2 * mean6 - mean3 (A: the old three, B: the new three). For each way of reading the cells (as
measured; fitted across bit widths, ../diagnosis/fit_across_bits.py) plan on A and on B at the four budgets of
plans.sh, and score each plan by its cells' summed KL on the other half over the same sum for the uniform setting
of the budget's table (the held-out ratio). Each plan's own half gives the predicted ratio."""
import json
import os
import subprocess
import sys

import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
DIAG = os.path.join(HERE, "..", "diagnosis")
sys.path.insert(0, DIAG)
from fit_across_bits import smooth  # noqa: E402

BUDGETS = {3: 4.076, 4: 4.992, 5: 5.909, 6: 6.825}
UNIFORMS = {3: ("int4_c128", "int2_t32_r32_s4"), 4: ("int5_c128", "int3_t32_r32_s4"),
            5: ("int6_c64", "int4_t64_r32_s4"), 6: ("int6_c64_r32_s4", "int5_t64_r32_s4")}
FLOOR = 1e-9  # B's cells are a difference of means: a cell at the noise floor can come out <= 0


def cells(df):
    return {(int(r.layer), r.tensor, r.scheme): float(r.kl) for r in df.itertuples()}


def main(tiny, old_csv, six_csv, work):
    os.makedirs(work, exist_ok=True)
    a = pd.read_csv(old_csv)
    six = pd.read_csv(six_csv)
    b = six.copy()
    old = cells(a)
    b["kl"] = [max(2 * r.kl - old[(int(r.layer), r.tensor, r.scheme)], FLOOR) for r in six.itertuples()]
    halves = {"A": a, "B": b}
    rows = []
    for read in ("measured", "fit-median"):
        for name, half in halves.items():
            other = halves["B" if name == "A" else "A"]
            table = half if read == "measured" else smooth(half, "median")
            csv = os.path.join(work, f"{name}-{read}.csv")
            table.to_csv(csv, index=False)
            folder = os.path.join(work, f"P-{name}-{read}")
            subprocess.run([sys.executable, os.path.join(DIAG, "profile_from_csv.py"), tiny, csv, folder], check=True)
            own, held = cells(table), cells(other)
            for bits, limit in BUDGETS.items():
                out = os.path.join(work, f"plan-{name}-{read}-{bits}.json")
                subprocess.run(["sensprof", "plan", folder, "--avg-bits", str(limit), "--context-len", "1024",
                                "--select-measured", "0", "--out", out], check=True, capture_output=True)
                layers = json.load(open(out))["layers"]
                uk, uv = UNIFORMS[bits]
                ratio = {}
                for label, c in (("predicted", own), ("held_out", held)):
                    plan = sum(c[(p["layer"], "K", p["k_scheme"])] + c[(p["layer"], "V", p["v_scheme"])] for p in layers)
                    uniform = sum(c[(i, "K", uk)] + c[(i, "V", uv)] for i in range(len(layers)))
                    ratio[label] = plan / uniform
                rows.append({"cells": read, "planned_on": name, "bits": bits, **ratio})
                print(rows[-1], flush=True)
    pd.DataFrame(rows).to_csv(os.path.join(work, "cross_fit.csv"), index=False)


if __name__ == "__main__":
    main(*sys.argv[1:5])
