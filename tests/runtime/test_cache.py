"""PlannedCache and PlannedLayer: decoding as the profiler predicted, bytes as the plan priced, sliding windows,
refused plans, and which decode steps the kernel serves."""

import types

import pytest
import torch
import transformers as tf
from conftest import make_tiny_model, tiny_config
from runtime.plans import decode_logprobs, make_plan

from sensprof.errors import SensprofError
from sensprof.profiling.hooks import attention_taps
from sensprof.memory import layer_cache_bytes
from sensprof.models import describe_layers
from sensprof.runtime import PlannedCache
from sensprof.runtime.generate import cache_kwarg
from sensprof.runtime.kernels import reference
from sensprof.runtime.store import runtime_problem
from sensprof.schemes import get_scheme
from sensprof.profiling.taps import QuantTap, StatsTap


def _calibration(model, ids):
    with attention_taps(model) as sess, torch.no_grad():
        taps = [StatsTap(sess, i) for i in range(len(describe_layers(model)))]
        for i, t in enumerate(taps):
            sess.set_tap(i, t)
        model(ids)
        sess.clear_taps()
    return [{k: st.head_absmax.tolist() for k, st in t.stats.items()} for t in taps]


def _fake_quant_logprobs(model, plan, ids):
    with attention_taps(model) as sess, torch.no_grad():
        for p in plan.layers:
            pair = tuple(None if n == "none" else get_scheme(n) for n in (p.k_scheme, p.v_scheme))
            cal = {k: torch.tensor(v) for k, v in p.absmax.items()}
            sess.set_tap(p.layer, QuantTap(sess, p.layer, [pair], ids.shape[0], cal, local=False))
        return model(ids, use_cache=False).logits.log_softmax(-1)


def _decode_against_profile(model, plan, ids):
    """(cache, run, ref, plain): next-token log-probabilities decoded token by token through a fresh PlannedCache,
    as the profiler's fake quantization predicts them, and unquantized."""
    ref = _fake_quant_logprobs(model, plan, ids)
    cache = PlannedCache.from_plan(plan, model)
    run = decode_logprobs(model, cache, ids)
    with torch.no_grad():
        plain = model(ids, use_cache=False).logits.log_softmax(-1)
    return cache, run, ref, plain


@pytest.mark.parametrize("arch,pairs", [
    ("llama", [("int4_c32", "int4_t32"), ("q4_0", "int3_t32_r16"), ("fp8_e4m3", "int8")]),
    # vLLM's own formats: rotated int4 per token-head (stored and read as vLLM does), fp8 with the query cast too
    ("llama", [("int4_per_token_head", "int4_per_token_head"), ("fp8_e4m3_qfp8", "fp8_e4m3"),
               ("int4_per_token_head", "none")]),
    ("llama", [("turboquant_4bit_nc.K", "turboquant_4bit_nc.V"), ("turboquant_k8v4.K", "turboquant_k8v4.V"),
               ("turboquant_3bit_nc.K", "turboquant_3bit_nc.V")]),
    ("llama", [("turboquant_k3v4_nc.K", "int4_t32"), ("turboquant_k8v4_e4b15.K", "none"),
               ("int4_c32", "turboquant_3bit_nc.V")]),
    ("gemma3", [("int4_c32", "int4_t32"), ("int2_t32_s2", "fp8_e4m3_cal"), ("int8_per_token_head", "none")]),
])
def test_decoding_matches_the_profilers_fake_quantization(arch, pairs, device):
    """Token by token, the runtime gives the next-token log-probabilities the profiler predicted."""
    model = make_tiny_model(arch).to(device)
    ids = torch.randint(3, 300, (2, 70), generator=torch.Generator().manual_seed(1)).to(device)
    plan = make_plan(model, pairs, _calibration(model, ids))
    cache, run, ref, plain = _decode_against_profile(model, plan, ids)
    assert (run - plain).abs().max() > 1e-3  # the quantization is real...
    assert (run - ref).abs().max() < 1e-4  # ...and exactly what the profile measured
    # every decode step of every layer read the packed cache (an unquantized side as it is held)
    assert all(layer.packed_steps == ids.shape[1] for layer in cache.layers)


def test_an_unquantized_side_is_read_in_place_not_copied_into_the_tail(monkeypatch):
    """A layer with K int4 and V unquantized (and one with neither quantized) hands the kernel the held values as a
    dense read: the tails passed on each step are the residual tokens only, not the whole cache."""
    model = _bf16_llama().float()
    plan = make_plan(model, [("int4_c32_r16", "none"), ("none", "none")], [{}] * 2)
    cache = PlannedCache.from_plan(plan, model, kernels="reference")
    seen = []
    decode = reference.decode_attention

    def spy(q, k, v, k_tail, v_tail, **kw):
        seen.append((k.dense, v.dense, k.tokens, k_tail.shape[-2], v_tail.shape[-2]))
        return decode(q, k, v, k_tail, v_tail, **kw)

    monkeypatch.setattr(reference, "decode_attention", spy)
    ids = torch.randint(3, 300, (1, 100), generator=torch.Generator().manual_seed(4))
    run = decode_logprobs(model, cache, ids)
    ref = _fake_quant_logprobs(model, plan, ids)
    assert (run - ref).abs().max() < 1e-4
    first, both = seen[0::2], seen[1::2]  # layer 0, layer 1 alternate
    # before K packs its first group, every token is in the tail; after, only K's residual and pending group
    assert all(not kd and vd == (n > 0) and kt < 16 + 32 and vt == kt for kd, vd, n, kt, vt in first)
    assert all(kd and vd and kt == vt == 0 for kd, vd, _, kt, vt in both)
    assert max(n for *_, n, _, _ in first) > 32 and both[-1][2] == 100


def _bf16_llama(head_dim=64, positions=4608):
    cfg, _ = tiny_config("llama")
    cfg = tf.LlamaConfig(**{**cfg.to_dict(), "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                            "head_dim": head_dim, "max_position_embeddings": positions, "num_hidden_layers": 2})
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)


def test_nbytes_equals_the_plan_prediction_and_4bit_is_3_5x_smaller_at_4k(device):
    model = _bf16_llama().to(device)
    n = 4096
    ids = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(2)).to(device)
    pairs = [("int4_c128", "int4_t64")] * 2
    plan = make_plan(model, pairs, [{}] * 2)
    cache = PlannedCache.from_plan(plan, model)
    with torch.no_grad():
        model(ids, use_cache=True, **{cache_kwarg(model): cache})
    predicted = sum(layer_cache_bytes(get_scheme(k), n, 2, 64) + layer_cache_bytes(get_scheme(v), n, 2, 64)
                    for k, v in pairs)
    assert cache.nbytes() == pytest.approx(predicted, rel=0.02)
    dyn = tf.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, use_cache=True, **{cache_kwarg(model): dyn})
    dense = sum(t.numel() * t.element_size() for layer in dyn.layers for t in (layer.keys, layer.values))
    assert dense / cache.nbytes() >= 3.5


def test_vllm_int4_per_token_head_holds_the_bytes_vllm_allocates(device):
    """Codes as 4 bit-planes (vLLM's nibbles: D / 2 bytes) and vLLM's one fp32 word of scale and zero-point."""
    model = _bf16_llama().to(device)
    n = 300
    ids = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(2)).to(device)
    plan = make_plan(model, [("int4_per_token_head", "int4_per_token_head")] * 2, [{}] * 2)
    cache = PlannedCache.from_plan(plan, model)
    with torch.no_grad():
        model(ids, use_cache=True, **{cache_kwarg(model): cache})
    assert cache.nbytes() == 2 * 2 * n * 2 * (64 // 2 + 4)  # layers x (K, V) x tokens x heads x bytes
    predicted = 2 * 2 * layer_cache_bytes(get_scheme("int4_per_token_head"), n, 2, 64)
    assert cache.nbytes() == pytest.approx(predicted, rel=0.01)


def test_sliding_layers_keep_only_their_window(device):
    model = make_tiny_model("gemma3").to(device)  # layers 0, 1 slide over 8 tokens
    plan = make_plan(model, [("int4_t32", "int4_t32"), ("none", "none"), ("none", "none")], [{}] * 3)
    cache = PlannedCache.from_plan(plan, model)
    ids = torch.randint(3, 300, (1, 1), generator=torch.Generator().manual_seed(3)).to(device)
    sizes = []
    with torch.no_grad():
        for _ in range(40):
            out = model(ids, use_cache=True, **{cache_kwarg(model): cache})
            ids = out.logits[:, -1:].argmax(-1)
            sizes.append(cache.layers[1].nbytes())
    assert sizes[-1] == sizes[20] > 0  # the sliding layer stopped growing
    assert cache.layers[2].nbytes() > 3 * sizes[-1]  # the full layer did not


def test_plan_for_another_model_and_unstorable_schemes_are_refused():
    model = make_tiny_model("llama")
    plan = make_plan(model, [("int4_c32", "int4_t32")] * 3, [{}] * 3)
    with pytest.raises(SensprofError, match="was made for model fingerprint"):
        PlannedCache.from_plan(plan, make_tiny_model("llama", seed=1))
    # a plan cannot price Octave at head_dim 32 (catalog.py); the runtime refuses it on its own too
    assert "Octave needs head_dim in multiples of 64" in runtime_problem(get_scheme("octave_k3v4.K"), 32)
    cal = make_plan(model, [("fp8_e4m3_cal", "none")] * 3, [{}] * 3)
    with pytest.raises(SensprofError, match="calibrated"):
        PlannedCache.from_plan(cal, model)


def test_an_engine_format_without_a_runtime_layout_is_refused_in_one_line(monkeypatch):
    """Every vLLM format has a layout today; one that lands without one is named, with what the runtime stores."""
    from sensprof.runtime import engine_layouts

    monkeypatch.delitem(engine_layouts.LAYOUTS, "vllm.octave_k3v4.K")
    wide = _bf16_llama()
    plan = make_plan(wide, [("octave_k3v4.K", "octave_k3v4.V")] * 2, [{}] * 2)
    with pytest.raises(SensprofError, match="cannot store scheme 'octave_k3v4.K'.*runtime stores int4_per_token_head"):
        PlannedCache.from_plan(plan, wide)


@pytest.mark.parametrize("pairs", [[("octave_k3v4.K", "octave_k3v4.V"), ("octave_k3v3.K", "octave_k3v3.V")],
                                   [("octave_k3v3_compact.K", "octave_k3v3_compact.V"), ("octave_k3v4.K", "none")]])
def test_vllm_octave_decodes_as_the_profiler_emulates_it_in_vllms_bytes(pairs):
    """ROCm's Octave (4-bit rotary and 3-bit other key dims, codebook codes, rotated): decoded token by token through
    the packed kernel as the profiler's emulation predicts, holding vLLM's code and scale bytes (its slot less
    the padding)."""
    from sensprof.engines.vllm.octave import Layout

    model = _bf16_llama().float()  # head_dim 64
    ids = torch.randint(3, 300, (1, 60), generator=torch.Generator().manual_seed(5))
    plan = make_plan(model, pairs, [{}] * 2)
    cache, run, ref, plain = _decode_against_profile(model, plan, ids)
    assert (run - plain).abs().max() > 1e-3
    assert (run - ref).abs().max() < 1e-4
    assert all(layer.packed_steps == ids.shape[1] for layer in cache.layers)
    lay = Layout(pairs[0][0].split(".")[0], 64, 64)
    k_bytes, v_bytes = lay.k_code_bytes + 2 * lay.k_scales, lay.v_code_bytes + 2
    assert cache.layers[0].nbytes() == 60 * 2 * (k_bytes + v_bytes)  # tokens x heads x bytes
    assert k_bytes + v_bytes <= lay.slot_bytes < k_bytes + v_bytes + 8


def test_a_head_dim_the_triton_tiles_cannot_span_is_read_densely():
    """A backend that declares NEEDS_POWER_OF_TWO_HEAD_DIM is not asked to decode head dim 24."""
    cfg, _ = tiny_config("llama")
    cfg = tf.LlamaConfig(**{**cfg.to_dict(), "head_dim": 24, "num_hidden_layers": 1})
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).eval()
    plan = make_plan(model, [("int4_c32", "int4_t32")], [{}])
    ids = torch.randint(3, 300, (1, 48), generator=torch.Generator().manual_seed(7))
    steps = {}
    for name, ops in (("reference", reference),
                      ("triton-like", types.SimpleNamespace(NEEDS_POWER_OF_TWO_HEAD_DIM=True,
                                                            decode_attention=reference.decode_attention))):
        cache = PlannedCache.from_plan(plan, model, kernels="reference")
        cache.layers[0].lazy_initialization(torch.zeros(1), None)
        cache.layers[0].kernels = ops
        decode_logprobs(model, cache, ids)
        steps[name] = cache.layers[0].packed_steps
    assert steps["reference"] > 0 and steps["triton-like"] == 0


@pytest.mark.parametrize("pair", [("nvfp4", "nvfp4"), ("nvfp4_4over6_qfp8", "nvfp4_4over6"),
                                  ("ultraquant_4bit.K", "ultraquant_4bit.V")])
def test_vllm_fp4_layouts_decode_as_the_profiler_measured(pair, device):
    """E2M1 codes with a scale byte per block (nvfp4: e4m3 per 16; ultraquant: UE8M0 per 32, rotated keys and an fp8
    query), held as vLLM holds them (head_dim 64, the least they take), one quantized layer at a time."""
    from conftest import _common

    cfg = tf.LlamaConfig(**_common(head_dim=64))
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).eval().to(device)
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 300, (2, 70), generator=torch.Generator().manual_seed(1)).to(device)
    plan = make_plan(model, [pair, ("none", "none"), ("none", "none")], _calibration(model, ids))
    ref = _fake_quant_logprobs(model, plan, ids)
    cache = PlannedCache.from_plan(plan, model)
    run = decode_logprobs(model, cache, ids)
    assert (run - ref).abs().max() < 1e-4 and cache.layers[0].packed_steps == ids.shape[1]
    per_token_head = 64 // 2 + 64 // (16 if pair[0].startswith("nvfp4") else 32)  # codes, then one byte a block
    assert cache.layers[0].nbytes() == 2 * ids.shape[0] * cfg.num_key_value_heads * ids.shape[1] * per_token_head
