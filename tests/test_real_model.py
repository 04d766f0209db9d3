"""One check on the real default model (SmolLM2-135M): a property the KV-quantization literature predicts."""

import pytest

from sensprof.schemes import parse_schemes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from sensprof.models import load_model

    try:
        return load_model("smollm2-135m", device="cpu")
    except Exception as e:  # pragma: no cover - the README's test command installs it
        pytest.fail(f"the default model could not be loaded: {e}")


@pytest.fixture(scope="module")
def real_profile(smollm2):
    from sensprof.data import load_windows
    from sensprof.profiling.profile import run_profile

    ids, name, digest = load_windows(smollm2.tokenizer, None, seq_len=128, windows=2, seed=0)
    # Same residual window for both layouts, so only the grouping axis differs.
    schemes = parse_schemes("int4_c32_r32,int4_t32_r32,int4_per_token_head")
    return run_profile(smollm2.model, ids, schemes, layers=[0, 1, 2, 3], model_id="smollm2-135m",
                       text_name=name, text_digest=digest, progress=False)


def test_layers_described(smollm2):
    from sensprof.models import describe_layers

    infos = describe_layers(smollm2.model)
    assert len(infos) == 30
    assert {(i.kind, i.kv_heads, i.head_dim) for i in infos} == {("full", 3, 64)}


def test_per_channel_keys_beat_per_token_keys(real_profile):
    """KIVI: keys have outlier channels, so per-channel statistics quantize them better."""
    k = real_profile.table[real_profile.table.tensor == "K"].set_index(["layer", "scheme"]).kl
    per_channel = k.xs("int4_c32_r32", level="scheme")
    per_token = k.xs("int4_t32_r32", level="scheme")
    assert per_channel.sum() < per_token.sum()
    assert (per_channel < per_token).sum() >= 3


def test_keys_cost_more_than_values_per_token(real_profile):
    """A key error passes through the softmax; at the same per-token scheme keys hurt more."""
    t = real_profile.table[real_profile.table.scheme == "int4_per_token_head"]
    assert t[t.tensor == "K"].kl.sum() > t[t.tensor == "V"].kl.sum()


def test_keys_have_outlier_channels(real_profile):
    """The reason for per-channel keys: key channels are far more uneven than value channels."""
    s = real_profile.stats
    k = s[s.tensor == "K"].outlier_ratio.mean()
    v = s[s.tensor == "V"].outlier_ratio.mean()
    assert k > v


def _uniform_plan(model, k, v):
    from sensprof.models import describe_layers, fingerprint
    from sensprof.artifacts import LayerPlan, Plan

    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, k, v, 0.0, 0.0, {})
              for i in describe_layers(model)]
    return Plan.hand_made("smollm2-135m", fingerprint(model), layers)


def test_8bit_plan_reproduces_greedy_output(smollm2):
    import torch

    from sensprof.runtime.generate import generate_with_plan

    model, tok = smollm2.model, smollm2.tokenizer
    prompt = "The three primary colors are"
    plan = _uniform_plan(model, "int8_per_token_head", "int8_per_token_head")
    run = generate_with_plan(model, tok, plan, [prompt], max_new_tokens=32)
    enc = tok([prompt], return_tensors="pt")
    with torch.inference_mode():
        ref = model.generate(**enc, max_new_tokens=32, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(run["ids"][0], ref[0, enc["input_ids"].shape[1]:])


def test_runtime_decoding_matches_the_profiler_on_the_real_model(smollm2):
    """Step by step, the planned cache gives what the profiler's fake quantization gives.

    Both decode one token at a time, so both see bit-identical keys: on a 30-layer model a batched
    forward and incremental decoding differ by ~1e-6 in K, which a rounding step (or an fp16-stored
    zero-point) can turn into a whole quantization step, and quantized layers compound it."""
    import torch
    from transformers import DynamicCache

    from sensprof.data import load_windows
    from sensprof.profiling.hooks import attention_taps
    from sensprof.runtime import PlannedCache
    from sensprof.runtime.generate import cache_kwarg
    from sensprof.schemes import get_scheme
    from sensprof.profiling.taps import QuantTap

    model = smollm2.model
    kw = cache_kwarg(model)
    ids, _, _ = load_windows(smollm2.tokenizer, None, seq_len=40, windows=1, seed=3)
    for k, v in (("int4_c32", "int4_t32"), ("q4_0", "int8_per_token_head")):
        plan = _uniform_plan(model, k, v)
        ref = []
        # fast=False: the profiler's eager attention, the arithmetic the runtime's dense path repeats (with SDPA a
        # ~1e-7 difference moves a code across a rounding boundary now and then, and 4-bit codes amplify it)
        with attention_taps(model, fast=False) as sess, torch.inference_mode():
            for p in plan.layers:
                sess.set_tap(p.layer, QuantTap(sess, p.layer, [(get_scheme(k), get_scheme(v))], 1, local=False))
            dyn = DynamicCache(config=model.config)
            for t in range(ids.shape[1]):
                ref.append(model(ids[:, t:t + 1], use_cache=True, **{kw: dyn}).logits[:, -1])
        runs = {}
        for packed in (False, True):
            cache = PlannedCache.from_plan(plan, model, packed_decode=packed)
            with torch.inference_mode():
                runs[packed] = torch.stack([model(ids[:, t:t + 1], use_cache=True, **{kw: cache}).logits[:, -1]
                                            for t in range(ids.shape[1])], 1).log_softmax(-1)
            packed_steps = sum(layer.packed_steps for layer in cache.layers)
            model.set_attn_implementation("eager")
        with torch.inference_mode():
            plain = model(ids, use_cache=False).logits.log_softmax(-1)
        ref = torch.stack(ref, 1).log_softmax(-1)
        run = runs[False]  # the dense path computes attention exactly as the profiler's eager attention
        assert (run - plain).abs().max() > 1e-2, (k, v)
        # Until the first key group of 32 is complete, every read is the same arithmetic: equal to 1e-3. After it,
        # the profiler's attention over its masked parts sums in another order (~1e-7 in the next layers' keys),
        # and with this GGUF's weights a code or two lands one rounding step away (seen with gguf 0.19): held,
        # as the packed path is, to a small fraction of the quantization's own effect.
        assert (run - ref)[:, :32].abs().max() < 1e-3, (k, v)
        assert (run - ref).abs().mean() < 0.01 * (run - plain).abs().mean(), (k, v)
        assert (run.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.97, (k, v)
        # The packed kernel sums in another order (~1e-7), and under 4-bit keys this model is that sensitive: a
        # relative 1e-7 nudge of one layer's attention output alone moves the dense path's log-probabilities by a
        # fifth of the quantization's effect (codes land one rounding step away downstream). So the packed path is
        # held to a few times that sensitivity, with the same top-1 tokens.
        g = torch.Generator().manual_seed(0)
        nudge = model.model.layers[0].self_attn.register_forward_hook(
            lambda m, a, out: (out[0] * (1 + 1e-7 * torch.randn(out[0].shape, generator=g)),) + tuple(out[1:]))
        try:
            cache = PlannedCache.from_plan(plan, model, packed_decode=False)
            with torch.inference_mode():
                nudged = torch.stack([model(ids[:, t:t + 1], use_cache=True, **{kw: cache}).logits[:, -1]
                                      for t in range(ids.shape[1])], 1).log_softmax(-1)
        finally:
            nudge.remove()
        sensitivity = (nudged - run).abs().mean()
        fast = runs[True]
        assert (fast - run).abs().mean() < 3 * sensitivity + 0.01 * (run - plain).abs().mean(), (k, v)
        assert (fast.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9, (k, v)
        if k == "int4_c32":
            assert packed_steps > 0


def test_runtime_prefill_matches_the_profiler_on_the_real_model(smollm2):
    """A prompt through the planned cache, in one chunk or three, gives the log-probabilities the profiler's fake
    quantization measured over the whole window (each position reading K and V as the cache held them then)."""
    import torch

    from sensprof.data import load_windows
    from sensprof.profiling.hooks import attention_taps
    from sensprof.runtime import PlannedCache
    from sensprof.runtime.generate import cache_kwarg
    from sensprof.schemes import get_scheme
    from sensprof.profiling.taps import QuantTap

    model = smollm2.model
    kw = cache_kwarg(model)
    ids, _, _ = load_windows(smollm2.tokenizer, None, seq_len=200, windows=1, seed=4)
    k, v = "int3_c32_r32_s4", "int4_t32"
    plan = _uniform_plan(model, k, v)
    with attention_taps(model, fast=False) as sess, torch.inference_mode():
        for p in plan.layers:
            sess.set_tap(p.layer, QuantTap(sess, p.layer, [(get_scheme(k), get_scheme(v))], 1, local=False))
        ref = model(ids, use_cache=False).logits.log_softmax(-1)
    with torch.inference_mode():
        plain = model(ids, use_cache=False).logits.log_softmax(-1)
    damage = (ref - plain).abs().mean()
    assert damage > 1e-3
    threads = torch.get_num_threads()
    for chunks in ([200], [64, 1, 135]):
        cache = PlannedCache.from_plan(plan, model)
        out, at = [], 0
        # one thread, so the sums run in one order: on this 2-core machine two threads moved [64, 1, 135] to 0.112
        # against a damage of 0.223 (2026-12-02), on the bound below, where one thread stays where it was measured
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                for n in chunks:
                    out.append(model(ids[:, at:at + n], use_cache=True, **{kw: cache}).logits)
                    at += n
        finally:
            torch.set_num_threads(threads)
        model.set_attn_implementation("eager")
        run = torch.cat(out, 1).log_softmax(-1)
        # The cache's prefill reads only what each block of queries can see (prefill.py), so its sums run in
        # another order than the profiler's pass over every version (~1e-7 apart in float32), and another chunking
        # runs the model's matmuls on other shapes too; quantization turns that into a code one step away now and
        # then, over 30 layers: the profiler itself moves as much between windows of 100 and 200 tokens. The tiny
        # models' tests (tests/runtime/test_prefill.py) hold prefill within 1e-4 of the profiler. Measured here
        # (2026-12-01): mean |difference| 0.097 / 0.069 for [200] / [64, 1, 135] against a damage of 0.215, with
        # 97.5% / 98% equal top-1 tokens.
        assert (run - ref).abs().mean() < 0.5 * damage, chunks
        assert (run.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.97, chunks
