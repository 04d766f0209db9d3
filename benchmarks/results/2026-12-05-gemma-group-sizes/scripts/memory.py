# As run: python scripts/memory.py PLAN.json ... (from the repository root): the bits per element each plan's cache
# holds at 1024 and 4096 tokens (plan.held_avg_bits: each layer weighed by the tokens it holds, Gemma's sliding
# layers 512), over what its budget's uniform setting (int<b>_c64_r32_s4 / int<b-1>_t64_r32_s4) holds.
import re, sys
from types import SimpleNamespace
from sensprof.artifacts import load_plan
from sensprof.planning.plan import held_avg_bits

for path in sys.argv[1:]:
    plan = load_plan(path)
    b = int(re.search(r"-(\d)bits", path).group(1))
    shape = [dict(kind=l.kind, window=l.window, kv_heads=l.kv_heads, head_dim=l.head_dim) for l in plan.layers]
    mine = [SimpleNamespace(k_scheme=l.k_scheme, v_scheme=l.v_scheme, **s) for l, s in zip(plan.layers, shape)]
    uni = [SimpleNamespace(k_scheme=f"int{b}_c64_r32_s4", v_scheme=f"int{b - 1}_t64_r32_s4", **s) for s in shape]
    print(path, " ".join(f"{n}: {held_avg_bits(mine, n):.4f} / {held_avg_bits(uni, n):.4f} = "
                         f"{held_avg_bits(mine, n) / held_avg_bits(uni, n):.4f}" for n in (1024, 4096)))
