"""Decode speed and cache bytes of the planned cache vs transformers' caches, on smollm2-135m (CPU).

For each context length: prefill that many corpus tokens into every cache, then decode --steps tokens
greedily, one step of each cache in turn (so a change in the machine's speed during the run hits every
cache alike), and print decode tokens/s and the cache's bytes, for DynamicCache (bytes as stored),
transformers' QuantizedCache (quanto and hqq backends, 4-bit) and PlannedCache (a uniform 4-bit plan and,
with --plan, a plan of yours).
    python benchmarks/runtime.py [--contexts 1024,4096,8128] [--steps 16] [--plan plans/kivi4-memory.json]
"""

import argparse
import time

import torch


def cache_bytes(cache) -> int:
    if hasattr(cache, "nbytes"):
        return cache.nbytes()
    total = 0
    for layer in cache.layers:
        for name in dir(layer):
            if name.startswith("_") and not name.startswith("_quantized"):
                continue
            try:
                t = getattr(layer, name)
            except Exception:
                continue
            for x in (t if isinstance(t, (list, tuple)) else [t]):
                if hasattr(x, "__tensor_flatten__") and type(x) is not torch.Tensor:  # quanto's packed tensors
                    inner, _ = x.__tensor_flatten__()
                    total += sum(getattr(x, n).numel() * getattr(x, n).element_size() for n in inner)
                elif isinstance(x, torch.Tensor):
                    total += x.numel() * x.element_size()
    return total


def uniform_plan(model, k, v):
    from sensprof.models import describe_layers, fingerprint
    from sensprof.artifacts import LayerPlan, Plan

    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, k, v, 0.0, 0.0, {})
              for i in describe_layers(model)]
    return Plan.hand_made("smollm2-135m", fingerprint(model), layers)


@torch.inference_mode()
def run(model, kw, make_cache, ids, steps):
    cache = make_cache()
    out = model(ids, use_cache=True, **{kw: cache})
    nxt = out.logits[:, -1:].argmax(-1)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(nxt, use_cache=True, **{kw: cache})
        nxt = out.logits[:, -1:].argmax(-1)
    return steps / (time.perf_counter() - t0), cache_bytes(cache)


@torch.inference_mode()
def run_interleaved(model, kw, caches, ids, steps):
    """Prefill every cache, then one decode step of each in turn: name -> (tokens/s, bytes) or the error."""
    state, spent, results = {}, {}, {}
    for name, make in caches.items():
        try:
            cache = make()
            nxt = model(ids, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)
            state[name], spent[name] = (cache, nxt), 0.0
        except Exception as e:  # a backend missing or failing is reported, not fatal
            results[name] = e
    for _ in range(steps):
        for name in list(state):
            cache, nxt = state[name]
            try:
                t0 = time.perf_counter()
                nxt = model(nxt, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)
                spent[name] += time.perf_counter() - t0
                state[name] = (cache, nxt)
            except Exception as e:
                results[name] = e
                del state[name]
    for name, (cache, _) in state.items():
        results[name] = (steps / spent[name], cache_bytes(cache))
    return {name: results[name] for name in caches}


def main():
    from transformers import DynamicCache, QuantizedCache

    from sensprof.data import load_windows
    from sensprof.models import load_model
    from sensprof.artifacts import load_plan
    from sensprof.runtime import PlannedCache
    from sensprof.runtime.generate import cache_kwarg

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1024,4096,8128")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--plan", default=None, help="also measure this plan (for smollm2-135m)")
    args = ap.parse_args()
    loaded = load_model("smollm2-135m", device="cpu")
    model, kw = loaded.model, cache_kwarg(loaded.model)
    model.set_attn_implementation("sdpa")
    caches = {
        "DynamicCache (fp32 here)": lambda: DynamicCache(config=model.config),
        "QuantizedCache quanto 4-bit": lambda: QuantizedCache("quanto", model.config, nbits=4),
        "QuantizedCache hqq 4-bit": lambda: QuantizedCache("hqq", model.config, nbits=4),
        "PlannedCache int4_c32/int4_t32": lambda: PlannedCache.from_plan(uniform_plan(model, "int4_c32", "int4_t32"),
                                                                         model),
    }
    if args.plan:
        plan = load_plan(args.plan)
        caches[f"PlannedCache {args.plan}"] = lambda: PlannedCache.from_plan(plan, model)
    print(f"smollm2-135m on CPU, torch threads {torch.get_num_threads()}, {args.steps} decode steps after prefill")
    warm = load_windows(loaded.tokenizer, None, seq_len=64, windows=1, seed=1)[0]
    for make in caches.values():  # first calls compile extensions (quanto) and warm allocators
        try:
            run(model, kw, make, warm, 1)
        except Exception:
            pass
    print(f"{'cache':<44}{'context':>8}{'tokens/s':>10}{'cache MiB':>11}")
    for n in (int(x) for x in args.contexts.split(",")):
        ids = load_windows(loaded.tokenizer, None, seq_len=n, windows=1, seed=0)[0]
        for name, result in run_interleaved(model, kw, caches, ids, args.steps).items():
            if isinstance(result, Exception):
                print(f"{name:<44}{n:>8}  failed: {type(result).__name__}: {str(result).splitlines()[0][:80]}",
                      flush=True)
            else:
                print(f"{name:<44}{n:>8}{result[0]:>10.2f}{result[1] / 2**20:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
