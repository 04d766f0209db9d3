"""Uniform settings with keys quantized before RoPE beside the README's best uniform settings (Gemma, help.html)."""
import os, sys, time, idlelib
import torch
from sensprof.artifacts import load_plan
from sensprof.data import text_windows
from sensprof.models import load_for_profile
from sensprof.validation.validate import layer_choices, measure, plan_reads

plan_path, windows, pairs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
plan = load_plan(plan_path)
loaded = load_for_profile(plan, {"model": {"id": plan.model_id}})
H = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
ids = text_windows(loaded.tokenizer, open(H, encoding="utf-8").read(), "html", 1024, windows, 12345)[0]
named = {p: layer_choices(plan, tuple(p.split("/"))) for p in pairs}
t0 = time.time()
m = measure(loaded.model, ids, named, reads=plan_reads(plan), per_token=True)
for p in pairs:
    print(f"{p:45s} KL {m[p]['kl']:.4e}", flush=True)
print(f"{time.time()-t0:.0f} s")
