# As run: OMP_NUM_THREADS=2 python screen_each.py TEXT N TOP PLAN...: the uniform baselines' screen that
# `sensprof validate PLAN --text TEXT --seq-len L` makes for each plan (one window of N = screen_length(profile's
# length, L) tokens of TEXT; every maximal uniform setting within the plan's budget, sensprof.validation.baselines),
# screened once for all the plans (best_uniforms_each, as `sweep` does), each plan's TOP printed.
import sys
from sensprof.artifacts import load_plan
from sensprof.models import load_for_plan
from sensprof.planning.uniforms import rank
from sensprof.validation.baselines import baseline_candidates, baseline_limit, best_uniforms_each, layer_info
from sensprof.validation.validate import plan_reads, read_user_text, validation_windows

text_path, n, top, paths = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
plans = [load_plan(p) for p in paths]
loaded = load_for_plan(plans[0], device="cpu", dtype="float32")
text = read_user_text(plans[0].profile.settings.get("text_digest"), [text_path])
ids = validation_windows(plans[0], loaded.tokenizer, 1, n, text)
bounds = [(p.budget, baseline_limit(p)) for p in plans]
_, k, v = best_uniforms_each(loaded.model, ids, plans[0], bounds, plan_reads(plans[0]), log=print)
for path, p, (budget, limit) in zip(paths, plans, bounds):
    configs = baseline_candidates(p, budget, limit)
    bits = limit / budget.elements(layer_info(p.layers))
    print(f"{path}: {len(configs)} maximal uniform settings within {bits:.4f} bits held at {budget.context_len}")
    for i, c in enumerate(rank(configs, k, v, len(configs))[:top]):
        print(f"{i + 1:3d} {c.label:45s} K {k.get(c.k, 0):.3e} V {v.get(c.v, 0):.3e} "
              f"sum {k.get(c.k, 0) + v.get(c.v, 0):.3e}")
