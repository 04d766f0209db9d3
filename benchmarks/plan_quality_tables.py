"""Markdown tables of benchmarks/plan_quality.py CSVs (as in benchmarks/results/2026-12-02-plan-quality.md): one table
per CSV and length, then every plan against the best uniform of both runs pooled (run from the repository root,
with the profiles/ the runs wrote).

    python benchmarks/plan_quality_tables.py CSV... ; python benchmarks/plan_quality_tables.py --pooled
"""
import math
import os
import sys

import pandas as pd

if len(sys.argv) > 1 and sys.argv[1] == "--pooled":
    rows=[]
    for model, files in (("SmolLM2-135M", ["profiles/smollm2-135m/plan_quality-345.csv","profiles/smollm2-135m/plan_quality-more.csv"]),
                         ("Gemma 3 270M", ["profiles/gemma3-270m/plan_quality-345.csv","profiles/gemma3-270m/plan_quality-more.csv"])):
        dfs=[pd.read_csv(f) for f in files if os.path.exists(f)]
        df=pd.concat(dfs, ignore_index=True)
        uni=df[df.budget.isna()].drop_duplicates(["seq_len","plan"])
        # the same config measured in two runs on the same windows: check equal
        d=df[df.budget.isna()].groupby(["seq_len","plan"]).measured_kl.agg(["min","max"])
        bad=d[(d["max"]-d["min"]).abs()>1e-9*d["max"].abs()]
        if len(bad): print("MISMATCH", model, bad)
        for r in df[df.budget.notna()].itertuples():
            pool=uni[(uni.seq_len==r.seq_len)&(uni.avg_bits<=r.avg_bits+1e-9)]
            b=pool.loc[pool.measured_kl.idxmin()]
            rows.append(dict(model=model, n=r.seq_len, budget=r.budget, plan=r.plan, bits=r.avg_bits, kl=r.measured_kl, pred=r.predicted_kl,
                             mp=r.measured_kl/r.predicted_kl, uni=b.plan.removeprefix("uniform "), ubits=b.avg_bits, ukl=b.measured_kl, ratio=r.measured_kl/b.measured_kl,
                             chosen=r.chosen if isinstance(r.chosen,str) else "", won=r.uniform_won))
    o=pd.DataFrame(rows).sort_values(["model","n","budget","plan"])
    print("| model | tokens | budget | plan | bits | measured KL | meas/pred | best uniform ≤ memory (bits): KL | plan / uniform | selection chose |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in o.itertuples():
        ch = "" if r.plan=="priced" else (r.chosen + (" (uniform won)" if str(r.won)=="True" else ""))
        print(f"| {r.model} | {r.n} | {r.budget:g} | {r.plan} | {r.bits:.3g} | {r.kl:.3g} | {r.mp:.2f} | `{r.uni}` ({r.ubits:.3g}): {r.ukl:.3g} | {r.ratio:.3f} | {ch} |")
else:
    def f(x, p=3):
        if x is None or (isinstance(x, float) and math.isnan(x)): return "–"
        if isinstance(x, float): return f"{x:.{p}g}" if abs(x) >= 1e-3 and abs(x) < 1e3 else f"{x:.2e}"
        return str(x)
    for path in sys.argv[1:]:
        df = pd.read_csv(path)
        print(f"\n<!-- {path} -->")
        for n, g in df.groupby("seq_len"):
            plans = g[g.budget.notna()]
            reads = g.reads.iloc[0] if "reads" in g else "streaming"  # CSVs before the column: the sensprof target's
            # CSVs before the column: their windows are written beside them (results READMEs), not here
            w = int(g.windows.iloc[0]) if "windows" in g else None
            seen = "unseen windows" if w is None else f"{w} unseen window{'s' if w > 1 else ''}"
            print(f"\n**{g.model.iloc[0]}, {n} tokens** ({seen}, read {reads})\n")
            print("| budget | plan | bits | measured KL | predicted KL | meas/pred | best uniform ≤ memory (bits) | its KL | plan / uniform | selection chose |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for r in plans.itertuples():
                chose = "" if r.plan == "priced" else (f"{r.chosen}" + (" (uniform won)" if str(r.uniform_won) == "True" else ""))
                u = "–" if not isinstance(r.best_uniform_le, str) else f"`{r.best_uniform_le.removeprefix('uniform ')}` ({r.best_uniform_le_bits:.3g})"
                print(f"| {r.budget:g} | {r.plan} | {r.avg_bits:.3g} | {f(r.measured_kl)} | {f(r.predicted_kl)} | {f(r.measured_over_predicted)} | {u} | {f(r.best_uniform_le_kl)} | {f(r.plan_over_uniform)} | {chose} |")
            uni = g[g.budget.isna()]
            print("\nuniform configurations measured: " + "; ".join(f"`{r.plan.removeprefix('uniform ')}` {r.avg_bits:.3g} bits {f(r.measured_kl)}" for r in uni.itertuples()))
