# As run: python scripts/held_against.py PLAN K/V ... (bits the plan holds over each uniform setting K/V holds, at 1024 tokens, averaged over 960-1087, 896-1023, 1025-1152, at 4096, and averaged over 4033-4160)
# plan / uniform bits held at lengths, and the mean over ranges
import sys
from types import SimpleNamespace
from sensprof.artifacts import load_plan
from sensprof.planning.plan import held_avg_bits
plan = load_plan(sys.argv[1])
for u in sys.argv[2:]:
    k, v = u.split("/")
    uni = [SimpleNamespace(k_scheme=k, v_scheme=v, kind=l.kind, window=l.window, kv_heads=l.kv_heads, head_dim=l.head_dim) for l in plan.layers]
    r = lambda n: held_avg_bits(plan.layers, n) / held_avg_bits(uni, n)
    m = lambda a, b: sum(r(n) for n in range(a, b)) / (b - a)
    print(sys.argv[1], u, "at1024 %.4f mean960-1087 %.4f mean896-1023 %.4f mean1025-1152 %.4f at4096 %.4f mean4033-4160 %.4f" % (r(1024), m(960, 1088), m(896, 1024), m(1025, 1153), r(4096), m(4033, 4161)))
