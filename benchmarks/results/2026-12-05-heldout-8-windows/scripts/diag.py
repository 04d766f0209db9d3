# run (2026-12-05) as: OMP_NUM_THREADS=2 python diag.py benchmarks/results/2026-12-04-long-menus/plans/gemma3-270m-selected-3bits.json int3_c64_r32_s4 int2_t64_r32_s4
"""Which half of Gemma's 3-bit plan loses on the HTML: keys or values?"""
import sys, time, os, dataclasses, json
import torch
torch.set_grad_enabled(False)
from sensprof.artifacts import load_plan
from sensprof.models import load_for_plan
from sensprof.validation.validate import read_user_text, validation_windows, measure, layer_choices, plan_reads
import idlelib
H = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
plan = load_plan(sys.argv[1])
uk, uv = sys.argv[2], sys.argv[3]
loaded = load_for_plan(plan, device="cpu", dtype="float32", quiet=True)
text = read_user_text(plan.profile.settings.get("text_digest"), [H])
ids = validation_windows(plan, loaded.tokenizer, 2, 1024, text)
P = list(plan.layers)
cfg = {
 "plan": P,
 "uniform": layer_choices(plan, (uk, uv)),
 "planK+uniV": [dataclasses.replace(p, v_scheme=uv) for p in P],
 "uniK+planV": [dataclasses.replace(p, k_scheme=uk) for p in P],
}
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
for name, pairs in extra.items():
    cfg[name] = [dataclasses.replace(p, k_scheme=k, v_scheme=v) for p, (k, v) in zip(P, pairs)]
t = time.time()
m = measure(loaded.model, ids, cfg, reads=plan_reads(plan), per_token=True)
for n in cfg: print(f"{n:<20} {m[n]['kl']:.4e}")
print(f"{time.time()-t:.0f} s")
