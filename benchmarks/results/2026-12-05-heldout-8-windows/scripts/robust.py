# run (2026-12-05) as: OMP_NUM_THREADS=2 python robust.py P-gemma-2w 3 int3_c64_r32_s4 int2_t64_r32_s4 0,1,2 benchmarks/results/2026-12-04-long-menus/plans/gemma3-270m-selected-3bits.json
"""Plans from a 2-window profile with --robust r (mean KL + r x spread across windows), measured with the best
uniform on the mixture's selection windows and on the HTML (2 x 1024 each)."""
import sys, os, time
import torch
torch.set_grad_enabled(False)
from sensprof.artifacts import load_plan
from sensprof.planning.budget import Budget
from sensprof.planning.plan import make_plan
from sensprof.planning.selection import selection_windows, paired_standard_error
from sensprof.models import load_for_plan
from sensprof.validation.validate import read_user_text, validation_windows, measure, layer_choices, plan_reads
import idlelib
H = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
prof_dir, bits, uk, uv = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
rs = [float(x) for x in sys.argv[5].split(",")]
others = sys.argv[6:]  # plan files to measure too
budget = Budget("avg_bits", bits)
plans = {f"robust {r:g}": make_plan(prof_dir, "sensprof", budget, "kl", robust=r) for r in rs}
first = next(iter(plans.values()))
cfg = {"uniform": layer_choices(first, (uk, uv))}
for n, p in plans.items():
    cfg[n] = list(p.layers)
for f in others:
    cfg[os.path.basename(f)] = list(load_plan(f).layers)
for n, L in cfg.items():
    print(f"{n:<32}", " ".join(f"{p.k_scheme.split('_r')[0][3:]}/{p.v_scheme.split('_r')[0][3:]}" for p in L), flush=True)
loaded = load_for_plan(first, device="cpu", dtype="float32", quiet=True)
sel, _ = selection_windows(loaded.tokenizer, first, 2, 1024)
text = read_user_text(first.profile.settings.get("text_digest"), [H])
html = validation_windows(first, loaded.tokenizer, 2, 1024, text)
for label, ids in (("mixture", sel), ("html", html)):
    t = time.time()
    m = measure(loaded.model, ids, cfg, reads=plan_reads(first), per_token=True)
    u = m["uniform"]
    print(label, f"{time.time()-t:.0f}s")
    for n in cfg:
        se = paired_standard_error(m[n]["kl_tokens"] - u["kl_tokens"])
        print(f"  {n:<32} {m[n]['kl']:.3e}  x{m[n]['kl']/u['kl']:.3f}  lead/se {(u['kl']-m[n]['kl'])/se[0] if se and se[0] else 0:.1f}", flush=True)
