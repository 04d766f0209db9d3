# run (2026-12-05) as: OMP_NUM_THREADS=2 python kw.py P-gemma3-270m-1024 3 int3_c64_r32_s4 int2_t64_r32_s4 1,1.5,2,3,5
"""Gemma/SmolLM2 plans solved with key damage weighted w: measured on the mixture's selection windows and on HTML."""
import sys, time, os, dataclasses
import torch
torch.set_grad_enabled(False)
from sensprof.planning.budget import Budget
from sensprof.planning.plan import make_plan, priced_table
from sensprof.planning.selection import _rebalanced, selection_windows
from sensprof.profiling.table import load_profile
from sensprof.targets import get_target
from sensprof.models import load_for_plan
from sensprof.validation.validate import read_user_text, validation_windows, measure, layer_choices, plan_reads
import idlelib
H = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
prof_dir, bits, uk, uv = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
weights = [float(x) for x in sys.argv[5].split(",")]
profile = load_profile(prof_dir, require_complete=True)
budget = Budget("avg_bits", bits)
plan = make_plan(prof_dir, "sensprof", budget, "kl")
tgt = get_target("sensprof", None, None, {l["head_dim"] for l in profile.meta["layers"]})
pricing = plan.predicted.pricing or {}
table, used = priced_table(profile, "sensprof", tgt, pricing.get("context_len") or budget.context_len)
cfg = {"uniform": layer_choices(plan, (uk, uv)), "w1": list(plan.layers)}
for w in weights:
    if w == 1: continue
    r = _rebalanced(plan, profile, table, used, tgt, budget, w)
    if r is not None: cfg[f"w{w:g}"] = list(r.layers)
for n, L in cfg.items():
    ks = [p.k_scheme.split("_r")[0] for p in L]; vs = [p.v_scheme.split("_r")[0] for p in L]
    print(n, " ".join(f"{k}/{v}" for k, v in zip(ks, vs)), flush=True)
loaded = load_for_plan(plan, device="cpu", dtype="float32", quiet=True)
sel, _ = selection_windows(loaded.tokenizer, plan, 2, 1024)
text = read_user_text(plan.profile.settings.get("text_digest"), [H])
html = validation_windows(plan, loaded.tokenizer, 2, 1024, text)
for label, ids in (("mixture", sel), ("html", html)):
    t = time.time()
    m = measure(loaded.model, ids, cfg, reads=plan_reads(plan), per_token=True)
    base = m["uniform"]["kl"]
    print(label, " ".join(f"{n}={m[n]['kl']:.3e}({m[n]['kl']/base:.3f})" for n in cfg), f"{time.time()-t:.0f}s", flush=True)
