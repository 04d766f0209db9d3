# As run, from this folder: OMP_NUM_THREADS=2 python scripts/uniforms_alone.py MODEL PLAN.json SEQ_LEN WINDOWS K/V ... (smollm2-value-sinks.txt: its first line)
# Uniform settings measured alone, every layer quantized at once, on the 8 HTML windows (seed 12345) the plans were judged on; the plan gives only the layer shapes and read regime.
import sys, time, idlelib, os
from sensprof.artifacts import load_plan
from sensprof.data import text_windows
from sensprof.models import load_model
from sensprof.planning.plan import held_avg_bits
from sensprof.validation.validate import layer_choices, measure, plan_reads
model, plan = sys.argv[1], load_plan(sys.argv[2])
seq, nwin = int(sys.argv[3]), int(sys.argv[4]); kvs = sys.argv[5:]
loaded = load_model(model, device="cpu", dtype="float32")
body = open(os.path.join(os.path.dirname(idlelib.__file__), "help.html"), encoding="utf-8").read()
ids = text_windows(loaded.tokenizer, body, "html", seq, nwin, 12345)[0]
t0 = time.time()
for kv in kvs:
    layers = layer_choices(plan, tuple(kv.split("/")))
    m = measure(loaded.model, ids, {kv: layers}, reads=plan_reads(plan))
    print(f"{kv:40s} held {held_avg_bits(layers, seq):.4f} kl {m[kv]['kl']:.3e}  {time.time()-t0:.0f}s", flush=True)
