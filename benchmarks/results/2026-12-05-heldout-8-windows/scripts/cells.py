# run (2026-12-05) as: OMP_NUM_THREADS=2 python cells.py benchmarks/results/2026-12-04-long-menus/plans/gemma3-270m-selected-3bits.json int2_c64_r32_s4,int3_c64_r32_s4 K
"""Single-layer key cells int2_c64 / int3_c64 of Gemma measured on the HTML windows (2 x 1024) vs the profile's."""
import sys, os, dataclasses, time
import torch
torch.set_grad_enabled(False)
from sensprof.artifacts import load_plan
from sensprof.models import load_for_plan
from sensprof.validation.validate import read_user_text, validation_windows, measure, plan_reads
import idlelib
H = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
plan = load_plan(sys.argv[1])
schemes = sys.argv[2].split(",")
tensor = sys.argv[3]
loaded = load_for_plan(plan, device="cpu", dtype="float32", quiet=True)
text = read_user_text(plan.profile.settings.get("text_digest"), [H])
ids = validation_windows(plan, loaded.tokenizer, 2, 1024, text)
base = [dataclasses.replace(p, k_scheme="none", v_scheme="none") for p in plan.layers]
cfg = {}
for i in range(len(base)):
    for s in schemes:
        L = list(base)
        L[i] = dataclasses.replace(L[i], **({"k_scheme": s} if tensor == "K" else {"v_scheme": s}))
        cfg[f"{i}:{s}"] = L
m = measure(loaded.model, ids, cfg, progress=lambda n: print(n, file=sys.stderr, flush=True), reads=plan_reads(plan), per_token=False)
for n in cfg: print(n, m[n]["kl"], flush=True)
