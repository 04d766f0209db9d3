"""Seconds to load a GGUF model: transformers unaided (config, weights, tokenizer, as sensprof called it before
sensprof/gguf_files.py) beside sensprof's load_model, first in a process and again in the same process (a notebook
or the test suite loading the model per command). Each figure is a fresh Python process's first or second load.
    python benchmarks/model_load.py [--model smollm2-135m] [--repeats 2]
"""

import argparse
import subprocess
import sys

UNAIDED = """
import time, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from sensprof.models import resolve_model
src = resolve_model({model!r}); kw = {{"gguf_file": src["gguf_file"]}}
for i in range(2):
    t = time.perf_counter()
    AutoConfig.from_pretrained(src["path"], **kw)
    AutoModelForCausalLM.from_pretrained(src["path"], dtype=torch.float32, attn_implementation="eager", **kw)
    AutoTokenizer.from_pretrained(src["path"], **kw)
    print(time.perf_counter() - t)
"""

SENSPROF = """
import time
from sensprof.models import load_model
for i in range(2):
    t = time.perf_counter()
    load_model({model!r}, device="cpu")
    print(time.perf_counter() - t)
"""


def timed(code: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"TQDM_DISABLE": "1", **__import__("os").environ}).stdout
    return [float(x) for x in out.split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print(f"{'how':<26} {'first load s':>13} {'second load s':>14}")
    for name, code in (("transformers unaided", UNAIDED), ("sensprof load_model", SENSPROF)):
        for _ in range(args.repeats):
            first, second = timed(code.format(model=args.model))
            print(f"{name:<26} {first:>13.1f} {second:>14.1f}")


if __name__ == "__main__":
    main()
