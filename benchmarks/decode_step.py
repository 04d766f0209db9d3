"""Where a decode step's time goes on smollm2-135m (CPU): ms per step in each part the cache adds to the model.

    python benchmarks/decode_step.py [--context 1024] [--steps 32] [--plan plans/...json ...]

DynamicCache first (its update and SDPA), then each plan: the layer's update (the stores' appends), the packed
decode (the layer's whole attention), and inside it the reads kept between steps (DecodeReads.step, of which the
tail and the reads rebuilt), the C decode wrapper and the C call itself. Each part is timed with perf_counter around
the call, summed over the 30 layers, so the parts carry a little timing overhead each; the step times are whole
forward passes. Run on a quiet machine: both cores are used.
"""

import argparse
import collections
import time

import torch

PARTS = collections.Counter()
ORDER = ["DynamicCache update", "SDPA", "layer update (appends)", "packed decode (all of it)", "  kept reads and tails",
         "    tails", "    reads rebuilt", "  C decode wrapper", "    read descriptions", "    C call"]


def timed(owner, name: str, label: str) -> None:
    """Replace owner.name by a version that adds its wall time to PARTS[label]."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PARTS[label] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def instrument() -> None:
    from transformers.cache_utils import DynamicLayer
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from sensprof.runtime import cache, decode_reads
    from sensprof.runtime.kernels import cpu_kernels

    timed(DynamicLayer, "update", "DynamicCache update")
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def timed_sdpa(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return sdpa(*args, **kwargs)
        finally:
            PARTS["SDPA"] += time.perf_counter() - t0

    ALL_ATTENTION_FUNCTIONS["sdpa"] = timed_sdpa
    timed(cache.PlannedLayer, "update", "layer update (appends)")
    timed(cache.PlannedLayer, "packed_decode", "packed decode (all of it)")
    timed(decode_reads.DecodeReads, "step", "  kept reads and tails")
    timed(decode_reads.DecodeReads, "_tail", "    tails")
    timed(decode_reads, "packed_reads", "    reads rebuilt")
    timed(cpu_kernels, "decode_attention", "  C decode wrapper")
    timed(cpu_kernels, "_describe", "    read descriptions")
    lib = cpu_kernels._lib()
    for name in ("sp_decode_attention", "sp_decode_packed"):
        fn = getattr(lib, name)

        def c_call(*args, fn=fn):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                PARTS["    C call"] += time.perf_counter() - t0

        setattr(lib, name, c_call)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--plan", nargs="*", default=["plans/smollm2-135m-sensprof-5bits.json",
                                                  "plans/smollm2-135m-vllm-5bits.json"])
    args = ap.parse_args()

    from transformers import DynamicCache

    from sensprof.artifacts import load_plan
    from sensprof.data import load_windows
    from sensprof.models import load_model
    from sensprof.runtime import PlannedCache
    from sensprof.runtime.generate import cache_kwarg

    loaded = load_model("smollm2-135m", device="cpu")
    model, kw = loaded.model, cache_kwarg(loaded.model)
    model.set_attn_implementation("sdpa")
    instrument()
    ids = load_windows(loaded.tokenizer, None, seq_len=args.context, windows=1, seed=0)[0]
    caches = {"DynamicCache": lambda: DynamicCache(config=model.config)}
    for path in args.plan:
        caches[path.rsplit("/", 1)[-1]] = lambda plan=load_plan(path): PlannedCache.from_plan(plan, model)
    print(f"smollm2-135m on CPU, torch threads {torch.get_num_threads()}, context {args.context}, {args.steps} decode "
          "steps after 3 warm-up steps; ms per step")
    with torch.inference_mode():
        for name, make in caches.items():
            cache = make()
            nxt = model(ids, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)
            for _ in range(3):
                nxt = model(nxt, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)
            PARTS.clear()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                nxt = model(nxt, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)
            step = (time.perf_counter() - t0) / args.steps * 1e3
            print(f"{name}: {step:.2f} ms per step")
            for part in ORDER:
                if part in PARTS:
                    print(f"  {part:34s} {PARTS[part] / args.steps * 1e3:6.2f}")


if __name__ == "__main__":
    main()
