# As run (in the folder holding P5k and plans-r*/ from plans.sh; HELP_HTML: idlelib/help.html):
#   OMP_NUM_THREADS=2 python judge.py P5k --text HELP_HTML --windows 8 --out html8.csv plans-r*/gemma3-270m-selected-*bits.json
#   OMP_NUM_THREADS=2 python judge.py P5k --text HELP_HTML --seq-len 4096 --windows 2 --out html4096x2.csv PLAN3 PLAN4 PLAN5
# Every distinct plan given, and each budget's best uniform setting (the 8-window table's), measured together on the
# same windows as benchmarks/plans_by_kind.py draws them (seed 12345), with plans_by_kind's paired standard error.
import argparse, json, time
import pandas as pd
from sensprof.artifacts import load_plan
from sensprof.data import text_windows
from sensprof.files import atomic_write_text
from sensprof.models import load_for_profile
from sensprof.planning.selection import paired_standard_error
from sensprof.profiling.table import load_profile
from sensprof.validation.validate import layer_choices, measure, plan_reads

UNIFORM = {3.0: "int3_c64_r32_s4/int2_t64_r32_s4", 4.0: "int4_c64_r32_s4/int3_t64_r32_s4",
           5.0: "int5_c64_r32_s4/int4_t64_r32_s4", 6.0: "int6_c64_r32_s4/int5_t64_r32_s4"}
ap = argparse.ArgumentParser()
ap.add_argument("profile"); ap.add_argument("plans", nargs="+")
ap.add_argument("--text", required=True); ap.add_argument("--windows", type=int, default=8)
ap.add_argument("--seq-len", type=int, default=1024); ap.add_argument("--out", required=True)
a = ap.parse_args()
meta = load_profile(a.profile, require_complete=True).meta
plans, seen = {}, {}
for path in a.plans:
    p = load_plan(path)
    key = json.dumps([(l.k_scheme, l.v_scheme) for l in p.layers])
    if key in seen:
        print(f"{path}: the same layers as {seen[key]}"); continue
    seen[key] = path; plans[path] = p
first = next(iter(plans.values()))
loaded = load_for_profile(first, meta)
named = {path: list(p.layers) for path, p in plans.items()}
budgets = sorted({p.budget.value for p in plans.values()})
for b in budgets:
    named[UNIFORM[b]] = layer_choices(first, tuple(UNIFORM[b].split("/")))
body = open(a.text, encoding="utf-8").read()
t0 = time.time()
ids = text_windows(loaded.tokenizer, body, "html", a.seq_len, a.windows, 12345)[0]
m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
rows = []
for path, p in plans.items():
    u = m[UNIFORM[p.budget.value]]; q = m[path]
    se = paired_standard_error(q["kl_tokens"] - u["kl_tokens"])[0]
    rows.append({"plan": path, "bits": p.budget.value, "robust": p.solver.robust, "plan_kl": q["kl"],
                 "uniform": UNIFORM[p.budget.value], "uniform_kl": u["kl"], "plan_over_uniform": q["kl"] / u["kl"],
                 "lead_in_standard_errors": (u["kl"] - q["kl"]) / se, "windows": int(ids.shape[0]),
                 "seq_len": int(ids.shape[1])})
    r = rows[-1]
    print(f"{path}: plan {r['plan_kl']:.3e}, {r['uniform']} {r['uniform_kl']:.3e}: x{r['plan_over_uniform']:.3f}, "
          f"lead {r['lead_in_standard_errors']:+.1f} SE", flush=True)
print(f"{time.time() - t0:.0f} s")
atomic_write_text(a.out, pd.DataFrame(rows).to_csv(index=False))
