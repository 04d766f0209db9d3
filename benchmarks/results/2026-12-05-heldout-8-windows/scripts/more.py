# run (2026-12-05) as: OMP_NUM_THREADS=2 python more.py 8 1024 PLANS/gemma3-270m-selected-3bits.json=int3_c64_r32_s4/int2_t64_r32_s4 ... (stopped after 3 bits: plans_by_kind.py replaced it)
"""Committed selected plans against their best uniform on N windows of the HTML: the ratio and its paired SE."""
import sys, os, time
import torch
torch.set_grad_enabled(False)
from sensprof.artifacts import load_plan
from sensprof.models import load_for_plan
from sensprof.planning.selection import paired_standard_error
from sensprof.validation.validate import read_user_text, validation_windows, measure, layer_choices, plan_reads
import idlelib
H = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
n, seq = int(sys.argv[1]), int(sys.argv[2])
jobs = [a.split("=") for a in sys.argv[3:]]  # plan.json=K/V
loaded = None
for f, kv in jobs:
    plan = load_plan(f)
    k, v = kv.split("/")
    if loaded is None:
        loaded = load_for_plan(plan, device="cpu", dtype="float32", quiet=True)
        text = read_user_text(plan.profile.settings.get("text_digest"), [H])
        ids = validation_windows(plan, loaded.tokenizer, n, seq, text)
        print("windows", tuple(ids.shape), flush=True)
    t = time.time()
    m = measure(loaded.model, ids, {"plan": list(plan.layers), "uniform": layer_choices(plan, (k, v))},
                reads=plan_reads(plan), per_token=True)
    d = m["plan"]["kl_tokens"] - m["uniform"]["kl_tokens"]
    se = paired_standard_error(d)[0]
    per = (m["plan"]["kl_tokens"].mean(1) / m["uniform"]["kl_tokens"].mean(1)).tolist()
    print(f"{os.path.basename(f)} plan {m['plan']['kl']:.3e} uniform {m['uniform']['kl']:.3e} "
          f"x{m['plan']['kl']/m['uniform']['kl']:.3f} lead/se {-d.mean().item()/se:.1f} "
          f"per-window {' '.join(f'{x:.2f}' for x in per)} {time.time()-t:.0f}s", flush=True)
