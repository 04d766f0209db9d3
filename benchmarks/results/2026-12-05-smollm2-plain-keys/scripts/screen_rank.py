# As run: OMP_NUM_THREADS=2 python screen_rank.py PLAN TEXT N TOP [K/V ...]: the uniform baselines' screen that
# `sensprof validate PLAN --text TEXT --seq-len N` makes (sensprof.validation.baselines: every maximal uniform setting
# within the plan's memory, each K and V scheme alone on one window of N tokens of TEXT), printed as a ranking: the
# TOP first and where each K/V named ranks.
import sys
from sensprof.artifacts import load_plan
from sensprof.models import load_for_plan
from sensprof.planning.uniforms import rank
from sensprof.validation.baselines import baseline_candidates, plan_cost, screen
from sensprof.validation.validate import plan_reads, read_user_text, validation_windows

plan = load_plan(sys.argv[1])
n, top = int(sys.argv[3]), int(sys.argv[4])
loaded = load_for_plan(plan, device="cpu", dtype="float32")
text = read_user_text(plan.profile.settings.get("text_digest"), [sys.argv[2]])
ids = validation_windows(plan, loaded.tokenizer, 1, n, text)
configs = baseline_candidates(plan, plan.budget, plan_cost(plan))
k, v = screen(loaded.model, ids, plan, configs, plan_reads(plan), log=print)
ranked = rank(configs, k, v, len(configs))
for i, c in enumerate(ranked[:top]):
    print(f"{i + 1:3d} {c.label:45s} K {k.get(c.k, 0):.3e} V {v.get(c.v, 0):.3e} sum {k.get(c.k, 0) + v.get(c.v, 0):.3e}")
for name in sys.argv[5:]:
    pos = [i for i, c in enumerate(ranked) if f"{c.k}/{c.v}" == name]
    print(name, "rank", pos[0] + 1 if pos else "not a candidate", "of", len(ranked))
