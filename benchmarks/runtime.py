"""Decode speed and cache bytes of the planned cache vs transformers' caches, on smollm2-135m (CPU).

For each context length: prefill that many corpus tokens into every cache, then decode --steps tokens
greedily, one step of each cache in turn (so a change in the machine's speed during the run hits every
cache alike), and print decode tokens/s, the cache's bytes and the prefill's seconds (one cache after another,
not interleaved), for DynamicCache (bytes as stored), transformers' QuantizedCache (quanto and hqq backends,
4-bit) and PlannedCache (a uniform 4-bit plan and, with --plan, a plan of yours). The QuantizedCache backends come with the `bench` extra:
    pip install -e '.[bench]'          # optimum-quanto and hqq
    python benchmarks/runtime.py [--contexts 1024,4096,8128] [--steps 16] [--plan P.json ...] [--examples]
    python benchmarks/runtime.py --quick  # one context of 256 tokens, 4 steps: a check, not a measurement
A cache that cannot run is reported on its row with the exception's type and message.
"""

import argparse
import time

import torch


def _stored_bytes(x, seen: set) -> int:
    """Bytes of the plain tensors under x: tensor subclasses are opened down to their storage (quanto's
    WeightQBitsTensor -> PackedTensor -> uint8 data, whose own shape is the unpacked one), and tuples, lists and
    dicts are walked (hqq keeps (packed data, meta) with the scales and zeros in the meta dict)."""
    if isinstance(x, (list, tuple)):
        return sum(_stored_bytes(y, seen) for y in x)
    if isinstance(x, dict):
        return sum(_stored_bytes(y, seen) for y in x.values())
    if not isinstance(x, torch.Tensor) or id(x) in seen:
        return 0
    seen.add(id(x))
    if type(x) is not torch.Tensor and hasattr(x, "__tensor_flatten__"):
        inner, _ = x.__tensor_flatten__()
        return sum(_stored_bytes(getattr(x, n), seen) for n in inner)
    return x.numel() * x.element_size()


def cache_bytes(cache) -> int:
    """The bytes a cache holds: PlannedCache counts its own; transformers' caches are walked layer by layer
    (the full-precision residual `keys`/`values` and the backend's `_quantized_keys`/`_quantized_values`)."""
    if hasattr(cache, "nbytes"):
        return cache.nbytes()
    seen: set = set()
    return sum(_stored_bytes(vars(layer), seen) for layer in cache.layers)


def why(e: BaseException) -> str:
    """One line: the exception's type and message (and, for a backend that is not installed, the fix)."""
    text = " ".join(str(e).split()) or "(no message)"
    if len(text) > 200:
        text = text[:197] + "..."
    hint = " [pip install -e '.[bench]']" if isinstance(e, ImportError) else ""
    return f"{type(e).__name__}: {text}{hint}"


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


def release_freed_memory() -> None:
    """Hand freed heap back to the OS (glibc): a prefill's temporaries, freed under the caches still held, otherwise
    stay in the process, and a dozen caches prefilled at 8K in turn exhausted 24 GiB that way (2026-12-06)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


@torch.inference_mode()
def run_interleaved(model, kw, caches, ids, steps):
    """Prefill every cache (timed, one after another), then one decode step of each in turn: name -> (tokens/s,
    bytes, packed share, prefill seconds) or the error."""
    state, spent, prefill, results = {}, {}, {}, {}
    for name, make in caches.items():
        try:
            cache = make()
            t0 = time.perf_counter()
            nxt = model(ids, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)
            prefill[name] = time.perf_counter() - t0
            state[name], spent[name] = (cache, nxt), 0.0
            release_freed_memory()
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
        packed = [getattr(layer, "packed_steps", None) for layer in cache.layers]
        share = None if None in packed else sum(packed) / (len(packed) * steps)
        results[name] = (steps / spent[name], cache_bytes(cache), share, prefill[name])
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
    ap.add_argument("--plan", action="append", default=[], help="also measure this plan (for smollm2-135m); repeatable")
    ap.add_argument("--examples", action="store_true",
                    help="also measure every example plan plans/make_examples.sh writes (plans/smollm2-135m-*bits.json)")
    ap.add_argument("--quick", action="store_true",
                    help="one context of 256 tokens and 4 decode steps (overrides --contexts and --steps): checks "
                         "that every cache runs in about a minute, its speeds are not a measurement")
    args = ap.parse_args()
    if args.quick:
        args.contexts, args.steps = "256", 4
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
    paths = list(args.plan)
    if args.examples:
        import glob

        paths += sorted(glob.glob("plans/smollm2-135m-*bits.json"), key=lambda p: ("vllm" in p, len(p), p))
    for path in paths:
        plan = load_plan(path)
        caches[f"PlannedCache {path.removeprefix('plans/smollm2-135m-')}"] = (
            lambda plan=plan: PlannedCache.from_plan(plan, model))
    print(f"smollm2-135m on CPU, torch threads {torch.get_num_threads()}, {args.steps} decode steps after prefill")
    warm = load_windows(loaded.tokenizer, None, seq_len=64, windows=1, seed=1)[0]
    for make in caches.values():  # first calls compile extensions (quanto) and warm allocators
        try:
            run(model, kw, make, warm, 1)
        except Exception:
            pass
    print(f"{'cache':<44}{'context':>8}{'tokens/s':>10}{'cache MiB':>11}{'prefill s':>11}  packed decode steps")
    for n in (int(x) for x in args.contexts.split(",")):
        ids = load_windows(loaded.tokenizer, None, seq_len=n, windows=1, seed=0)[0]
        for name, result in run_interleaved(model, kw, caches, ids, args.steps).items():
            if isinstance(result, Exception):
                print(f"{name:<44}{n:>8}  failed: {why(result)}", flush=True)
            else:
                share = "" if result[2] is None else f"  {result[2]:.0%}"
                print(f"{name:<44}{n:>8}{result[0]:>10.2f}{result[1] / 2**20:>11.2f}{result[3]:>11.2f}{share}",
                      flush=True)


if __name__ == "__main__":
    main()
