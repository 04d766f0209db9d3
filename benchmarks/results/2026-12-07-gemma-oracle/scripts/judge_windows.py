"""As run: python judge_windows.py PROFILE OUT_CSV B=PLAN.json ... --uniforms B=K/V,... : every plan and uniform
setting measured with all layers quantized at once on the README table's 8 x 1024 tokens of IDLE's help.html (seed
12345, benchmarks/plans_by_kind.py's windows), one row per configuration and window: mean KL on that window, so the
windows the oracle profile read (slots 0, 9, 11, 13) and the other four can be summed apart, with paired standard
errors over 8 blocks a window as plans_by_kind counts them."""
import argparse
import os

import pandas as pd

ap = argparse.ArgumentParser()
ap.add_argument("profile")
ap.add_argument("out_csv")
ap.add_argument("plans", nargs="+", metavar="B=PLAN")
ap.add_argument("--uniforms", required=True, help="B=K/V,B=K/V")
a = ap.parse_args()

import idlelib  # noqa: E402

from sensprof.artifacts import load_plan  # noqa: E402
from sensprof.data import text_windows  # noqa: E402
from sensprof.files import atomic_write_text  # noqa: E402
from sensprof.models import load_for_profile  # noqa: E402
from sensprof.planning.plan import held_avg_bits  # noqa: E402
from sensprof.profiling.table import load_profile  # noqa: E402
from sensprof.validation.validate import layer_choices, measure, plan_reads  # noqa: E402

meta = load_profile(a.profile, require_complete=True).meta
plans = {}
for item in a.plans:
    b, path = item.split("=", 1)
    plans[f"{b} plan {path}"] = load_plan(path)
first = next(iter(plans.values()))
named = {name: list(p.layers) for name, p in plans.items()}
for item in a.uniforms.split(","):
    b, pair = item.split("=", 1)
    named[f"{b} uniform {pair}"] = layer_choices(first, tuple(pair.split("/")))
loaded = load_for_profile(first, meta)
html = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
with open(html, encoding="utf-8") as f:
    ids, _, digest, slots = text_windows(loaded.tokenizer, f.read(), "html", 1024, 8, 12345)
m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
rows = []
for name, r in m.items():
    if name == "baseline":
        continue
    b, kind, what = name.split(" ", 2)
    per_window = r["kl_tokens"].mean(-1)
    for w, slot in enumerate(slots):
        rows.append({"bits": b, "kind": kind, "config": what, "slot": slot, "kl": float(per_window[w]),
                     "bits_held": held_avg_bits(named[name], 1024), "digest": digest})
    size = r["kl_tokens"].shape[1] // 8
    blocks = r["kl_tokens"][:, :size * 8].reshape(len(slots), 8, size).mean(-1)  # [windows, 8 blocks]
    for w, slot in enumerate(slots):
        for k in range(8):
            rows.append({"bits": b, "kind": kind, "config": what, "slot": slot, "block": k,
                         "kl": float(blocks[w, k]), "bits_held": held_avg_bits(named[name], 1024), "digest": digest})
atomic_write_text(a.out_csv, pd.DataFrame(rows).to_csv(index=False))
print(f"wrote {a.out_csv}: windows {slots}, text digest {digest}")
