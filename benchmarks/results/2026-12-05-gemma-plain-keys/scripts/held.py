# As run: python scripts/held.py plans/*-r0.json plans/*-r2.json plans-at4096/*.json (from this folder): the bits per element each plan's cache
# holds after N tokens (plan.held_avg_bits: each layer weighed by the tokens it holds, sinks, residual windows and
# incomplete groups at 16 bits) over what its budget's uniform setting int<b>_c64_r32_s4 / int<b-1>_t64_r32_s4 holds,
# at lengths around 1024 (a 64-token key group completes at 1024, so plain keys hold no pending group there) and 4096.
import re, sys
from types import SimpleNamespace
from sensprof.artifacts import load_plan
from sensprof.planning.plan import held_avg_bits

LENGTHS = (1000, 1024, 1050, 4096)
print("plan", *(f"at {n}" for n in LENGTHS), "mean over 960..1087", sep="\t")
for path in sys.argv[1:]:
    plan = load_plan(path)
    b = int(re.search(r"-(\d)bits", path).group(1))
    uni = [SimpleNamespace(k_scheme=f"int{b}_c64_r32_s4", v_scheme=f"int{b - 1}_t64_r32_s4", kind=l.kind,
                           window=l.window, kv_heads=l.kv_heads, head_dim=l.head_dim) for l in plan.layers]
    ratio = [held_avg_bits(plan.layers, n) / held_avg_bits(uni, n) for n in range(960, 1088)]
    print(path, *(f"{held_avg_bits(plan.layers, n) / held_avg_bits(uni, n):.4f}" for n in LENGTHS),
          f"{sum(ratio) / len(ratio):.4f}", sep="\t")
