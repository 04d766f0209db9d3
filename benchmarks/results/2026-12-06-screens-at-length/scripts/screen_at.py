"""The uniform settings `validate`'s screen ranks best for each of several plans, at one length, on the user's text:
one screen shared by every plan's budget (sensprof.validation.baselines.best_uniforms_each), as validate ranks them.

    python screen_at.py --seq-len 4096 --text FILE --out screen.csv PLAN.json [PLAN.json ...]

Writes every screened scheme's KL (kind K or V) and, per plan, its top pairs with their summed screen KL.
"""
import argparse
import os

import pandas as pd
import torch

from sensprof.artifacts import load_plan
from sensprof.models import load_for_plan
from sensprof.validation.baselines import baseline_limit, best_uniforms_each, screen_length
from sensprof.validation.validate import plan_reads, read_user_text, validation_windows

ap = argparse.ArgumentParser()
ap.add_argument("plans", nargs="+")
ap.add_argument("--seq-len", type=int, required=True)
ap.add_argument("--text", required=True)
ap.add_argument("--top", type=int, default=3)
ap.add_argument("--out", required=True)
args = ap.parse_args()
plans = [load_plan(p) for p in args.plans]
template = plans[0]
text = read_user_text(template.profile.settings.get("text_digest"), [args.text])
loaded = load_for_plan(template, device="cpu", quiet=True)
ids = validation_windows(template, loaded.tokenizer, 1, screen_length(args.seq_len, args.seq_len), text)
with torch.no_grad():
    each, k_screen, v_screen = best_uniforms_each(loaded.model, ids, template,
                                                  [(p.budget, baseline_limit(p)) for p in plans],
                                                  plan_reads(template), top=args.top, log=print)
rows = [{"plan": "", "rank": "", "kind": "K", "k_scheme": k, "v_scheme": "", "screen_kl": kl} for k, kl in k_screen.items()]
rows += [{"plan": "", "rank": "", "kind": "V", "k_scheme": "", "v_scheme": v, "screen_kl": kl} for v, kl in v_screen.items()]
for path, chosen in zip(args.plans, each):
    for i, c in enumerate(chosen, 1):
        rows.append({"plan": os.path.basename(path), "rank": i, "kind": "pair", "k_scheme": c.k, "v_scheme": c.v,
                     "screen_kl": k_screen.get(c.k, 0.0) + v_screen.get(c.v, 0.0)})
        print(f"{os.path.basename(path)}: {i}. {c.k} / {c.v}  {rows[-1]['screen_kl']:.3e}")
pd.DataFrame(rows).to_csv(args.out, index=False)
print(f"wrote {args.out} ({ids.shape[0]} x {ids.shape[1]} tokens of {args.text})")
