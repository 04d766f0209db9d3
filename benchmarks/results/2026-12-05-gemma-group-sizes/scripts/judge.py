# As run (in the folder holding the profile PG and plans-*/ from plans.sh; HELP_HTML: idlelib/help.html):
#   OMP_NUM_THREADS=2 python scripts/judge.py PG --text HELP_HTML --windows 8 --out html8.csv plans-at1024/*.json plans-long/*.json
#   OMP_NUM_THREADS=2 python scripts/judge.py PG --text HELP_HTML --windows 8 --out html8-uniforms-at1024.csv \
#       --uniforms "$(cat uniforms-at1024.txt)" plans-at1024/*.json     # the 12 uniform settings of ../README.md
#   OMP_NUM_THREADS=2 python scripts/judge.py PG --text HELP_HTML --seq-len 4096 --windows 2 --out html4096x2.csv plans-at4096/*.json
# Every distinct plan given and its budget's best uniform setting (the 8-window table's, by the whole bits of the
# plan's name), measured together on the same windows as benchmarks/plans_by_kind.py draws them (seed 12345), with
# its paired standard error (--uniforms B=K/V,...: these instead, each beside every B-bit plan), and each one's memory: the bits per element a cache of --seq-len tokens holds
# (plan.held_avg_bits, each layer weighed by the tokens it holds: Gemma's sliding layers hold 512).
import argparse, json, re, time
from types import SimpleNamespace
import pandas as pd
from sensprof.artifacts import load_plan
from sensprof.data import text_windows
from sensprof.files import atomic_write_text
from sensprof.models import load_for_profile
from sensprof.planning.plan import held_avg_bits
from sensprof.planning.selection import paired_standard_error
from sensprof.profiling.table import load_profile
from sensprof.validation.validate import layer_choices, measure, plan_reads

UNIFORM = {3: "int3_c64_r32_s4/int2_t64_r32_s4", 4: "int4_c64_r32_s4/int3_t64_r32_s4",
           5: "int5_c64_r32_s4/int4_t64_r32_s4", 6: "int6_c64_r32_s4/int5_t64_r32_s4"}
ap = argparse.ArgumentParser()
ap.add_argument("profile"); ap.add_argument("plans", nargs="+")
ap.add_argument("--text", required=True); ap.add_argument("--windows", type=int, default=8)
ap.add_argument("--seq-len", type=int, default=1024); ap.add_argument("--out", required=True)
ap.add_argument("--uniforms", default="")
a = ap.parse_args()
if a.uniforms:
    UNIFORM = {}
    for item in a.uniforms.split(","):
        b, _, kv = item.partition("=")
        UNIFORM.setdefault(int(b), []).append(kv)
else:
    UNIFORM = {b: [kv] for b, kv in UNIFORM.items()}
meta = load_profile(a.profile, require_complete=True).meta
plans, seen = {}, {}
for path in a.plans:
    p = load_plan(path)
    key = json.dumps([(l.k_scheme, l.v_scheme) for l in p.layers])
    if key in seen:
        print(f"{path}: the same layers as {seen[key]}"); continue
    seen[key] = path; plans[path] = p
bits_of = {path: int(re.search(r"-(\d)bits", path).group(1)) for path in plans}
first = next(iter(plans.values()))
loaded = load_for_profile(first, meta)
named = {path: list(p.layers) for path, p in plans.items()}
for b in sorted(set(bits_of.values())):
    for kv in UNIFORM[b]:
        named[kv] = layer_choices(first, tuple(kv.split("/")))


def held(layers):
    return held_avg_bits([SimpleNamespace(k_scheme=l.k_scheme, v_scheme=l.v_scheme, kind=l.kind, window=l.window,
                                          kv_heads=l.kv_heads, head_dim=l.head_dim) for l in layers], a.seq_len)


body = open(a.text, encoding="utf-8").read()
t0 = time.time()
ids = text_windows(loaded.tokenizer, body, "html", a.seq_len, a.windows, 12345)[0]
m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
rows = []
for path, uni in ((path, uni) for path in plans for uni in UNIFORM[bits_of[path]]):
    p = plans[path]
    u = m[uni]; q = m[path]
    se = paired_standard_error(q["kl_tokens"] - u["kl_tokens"])[0]
    rows.append({"plan": path, "budget": p.budget.value, "context_len": p.budget.context_len,
                 "robust": p.solver.robust, "plan_kl": q["kl"], "uniform": uni, "uniform_kl": u["kl"],
                 "plan_over_uniform": q["kl"] / u["kl"], "lead_in_standard_errors": (u["kl"] - q["kl"]) / se,
                 "plan_bits_held": held(p.layers), "uniform_bits_held": held(named[uni]),
                 "windows": int(ids.shape[0]), "seq_len": int(ids.shape[1])})
    r = rows[-1]
    print(f"{path}: plan {r['plan_kl']:.3e} ({r['plan_bits_held']:.4f} bits held), {uni} {r['uniform_kl']:.3e} "
          f"({r['uniform_bits_held']:.4f}): x{r['plan_over_uniform']:.3f}, lead {r['lead_in_standard_errors']:+.1f} SE",
          flush=True)
print(f"{time.time() - t0:.0f} s")
atomic_write_text(a.out, pd.DataFrame(rows).to_csv(index=False))
