"""The planned-cache runtime: packing, streaming storage, equivalence with the profiler, bytes, generate."""

import os

import pytest
import torch
from conftest import make_tiny_model, tiny_config

from sensprof.errors import SensprofError
from sensprof.hooks import attention_taps
from sensprof.memory import layer_cache_bytes
from sensprof.models import describe_layers, fingerprint
from sensprof.plan import LayerPlan, Plan
from sensprof.quant import fake_quant
from sensprof.runtime import PlannedCache
from sensprof.runtime.generate import cache_kwarg, generate_with_plan
from sensprof.runtime.kernels import pack_bitplanes, unpack_bitplanes
from sensprof.runtime.store import TensorStore
from sensprof.schemes import get_scheme
from sensprof.taps import QuantTap, StatsTap


@pytest.mark.parametrize("bits", range(2, 9))
def test_bitplanes_round_trip_exactly_and_cost_b_bits(bits):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (2, 3, 5, 64), generator=g, dtype=torch.uint8)
    packed = pack_bitplanes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() * 8 == codes.numel() * bits
    assert torch.equal(unpack_bitplanes(packed, bits), codes)


def test_packing_needs_a_multiple_of_eight():
    with pytest.raises(ValueError):
        pack_bitplanes(torch.zeros(1, 12, dtype=torch.uint8), 4)


@pytest.mark.parametrize("name", ["int4_c32", "int3_t32", "q4_0", "q5_1", "int2_c64_r16_s4", "int8_per_token_head",
                                  "fp8_e4m3", "fp8_per_token_head", "int6_t128_r8"])
def test_store_holds_what_fake_quant_computes(name):
    """Appended in uneven chunks, the store's quantized tokens equal fake quantization of the whole."""
    s = get_scheme(name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 150, 64, generator=g) * 3
    store = TensorStore(s)
    for a, b in ((0, 1), (1, 40), (40, 41), (41, 100), (100, 150)):
        store.append(x[..., a:b, :])
    dense = store.dense()
    assert dense.shape == x.shape
    from sensprof.memory import quantized_token_count

    q = quantized_token_count(s, 150)
    lo = min(s.sink, 150)
    ref = fake_quant(x, s)
    assert torch.equal(dense[..., lo:lo + q, :], ref[..., lo:lo + q, :])
    assert torch.equal(dense[..., :lo, :], x[..., :lo, :])
    assert torch.equal(dense[..., lo + q:, :], x[..., lo + q:, :])


def _calibration(model, ids):
    with attention_taps(model) as sess, torch.no_grad():
        taps = [StatsTap(sess, i) for i in range(len(describe_layers(model)))]
        for i, t in enumerate(taps):
            sess.set_tap(i, t)
        model(ids)
        sess.clear_taps()
    return [{k: st.head_absmax.tolist() for k, st in t.stats.items()} for t in taps]


def _plan(model, pairs, absmax):
    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, k, v, 0.0, 0.0, absmax[i.index])
              for i, (k, v) in zip(describe_layers(model), pairs)]
    return Plan("tiny", fingerprint(model), "sensprof", "kl", {}, layers, {}, {}, {}, {})


def _fake_quant_logprobs(model, plan, ids):
    with attention_taps(model) as sess, torch.no_grad():
        for p in plan.layers:
            pair = tuple(None if n == "none" else get_scheme(n) for n in (p.k_scheme, p.v_scheme))
            cal = {k: torch.tensor(v) for k, v in p.absmax.items()}
            sess.set_tap(p.layer, QuantTap(sess, p.layer, [pair], ids.shape[0], cal, local=False))
        return model(ids, use_cache=False).logits.log_softmax(-1)


@pytest.mark.parametrize("arch,pairs", [
    ("llama", [("int4_c32", "int4_t32"), ("q4_0", "int3_t32_r16"), ("fp8_e4m3", "int8")]),
    ("gemma3", [("int4_c32", "int4_t32"), ("int2_t32_s2", "fp8_e4m3_cal"), ("int8_per_token_head", "none")]),
])
def test_decoding_matches_the_profilers_fake_quantization(arch, pairs):
    """Token by token, the runtime gives the next-token log-probabilities the profiler predicted."""
    model = make_tiny_model(arch)
    ids = torch.randint(3, 300, (2, 70), generator=torch.Generator().manual_seed(1))
    plan = _plan(model, pairs, _calibration(model, ids))
    ref = _fake_quant_logprobs(model, plan, ids)
    cache = PlannedCache.from_plan(plan, model)
    steps = []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            out = model(ids[:, t:t + 1], use_cache=True, **{cache_kwarg(model): cache})
            steps.append(out.logits[:, -1].log_softmax(-1))
    run = torch.stack(steps, 1)
    plain = model(ids, use_cache=False).logits.log_softmax(-1)
    assert (run - plain).abs().max() > 1e-3  # the quantization is real...
    assert (run - ref).abs().max() < 1e-4  # ...and exactly what the profile measured
    if arch == "llama":  # layer 0 (int4_c32 / int4_t32, full attention) was read by the packed kernel
        assert cache.layers[0].packed_steps > 0


def _decode(model, cache, ids):
    steps = []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], use_cache=True, **{cache_kwarg(model): cache}).logits[:, -1])
    return torch.stack(steps, 1).log_softmax(-1)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_decode_reads_the_same_cache_as_the_dense_path(arch):
    """Residual windows, sinks, different K and V lengths and group sizes: the kernel reads the packed
    positions both hold, the rest goes in its full-precision tail; the result is the dense path's."""
    model = make_tiny_model(arch)
    pairs = [("int4_c32_r16_s2", "int2_t32_s3"), ("int3_c64", "int4_t32_r8"), ("int8_c32", "int5_t32")]
    plan = _plan(model, pairs, [{}] * 3)
    ids = torch.randint(3, 300, (2, 150), generator=torch.Generator().manual_seed(4))
    dense = _decode(model, PlannedCache.from_plan(plan, packed_decode=False), ids)
    cache = PlannedCache.from_plan(plan, model, kernels="reference")
    packed = _decode(model, cache, ids)
    assert model.config._attn_implementation.startswith("sensprof_planned_")
    assert all(layer.packed_steps > 60 for layer in cache.layers)
    assert (packed - dense).abs().max() < 1e-5


def test_packed_decode_defers_to_the_dense_path_where_the_kernel_does_not_apply(tiny_tokenizer):
    """fp8 / per-token keys are read densely; a left-padded batch's mask hides tokens, so it is read densely
    too; either way generate gives the dense path's tokens."""
    from sensprof.runtime.generate import generate_with_plan

    model = make_tiny_model("llama")
    plan = _plan(model, [("fp8_e4m3", "int4_t32"), ("int4_c32", "int4_t32"), ("int4_t32", "int4_c32")], [{}] * 3)
    prompts = ["the cat sat on the mat " * 6, "hello"]
    got = generate_with_plan(model, tiny_tokenizer, plan, prompts, max_new_tokens=12)
    model2 = make_tiny_model("llama")
    want = generate_with_plan(model2, tiny_tokenizer, plan, prompts, max_new_tokens=12, packed_decode=False)
    assert torch.equal(got["ids"], want["ids"])
    assert model2.config._attn_implementation == "eager"


def _bf16_llama(head_dim=64, positions=4608):
    import transformers as tf

    cfg, _ = tiny_config("llama")
    cfg = tf.LlamaConfig(**{**cfg.to_dict(), "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                            "head_dim": head_dim, "max_position_embeddings": positions, "num_hidden_layers": 2})
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)


def test_nbytes_equals_the_plan_prediction_and_4bit_is_3_5x_smaller_at_4k():
    model = _bf16_llama()
    n = 4096
    ids = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(2))
    pairs = [("int4_c128", "int4_t64")] * 2
    plan = _plan(model, pairs, [{}] * 2)
    cache = PlannedCache.from_plan(plan, model)
    with torch.no_grad():
        model(ids, use_cache=True, **{cache_kwarg(model): cache})
    predicted = sum(layer_cache_bytes(get_scheme(k), n, 2, 64) + layer_cache_bytes(get_scheme(v), n, 2, 64)
                    for k, v in pairs)
    assert cache.nbytes() == pytest.approx(predicted, rel=0.02)
    from transformers import DynamicCache

    dyn = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, use_cache=True, **{cache_kwarg(model): dyn})
    dense = sum(t.numel() * t.element_size() for layer in dyn.layers for t in (layer.keys, layer.values))
    assert dense / cache.nbytes() >= 3.5


def test_sliding_layers_keep_only_their_window():
    model = make_tiny_model("gemma3")  # layers 0, 1 slide over 8 tokens
    plan = _plan(model, [("int4_t32", "int4_t32"), ("none", "none"), ("none", "none")], [{}] * 3)
    cache = PlannedCache.from_plan(plan, model)
    ids = torch.randint(3, 300, (1, 1), generator=torch.Generator().manual_seed(3))
    sizes = []
    with torch.no_grad():
        for _ in range(40):
            out = model(ids, use_cache=True, **{cache_kwarg(model): cache})
            ids = out.logits[:, -1:].argmax(-1)
            sizes.append(cache.layers[1].nbytes())
    assert sizes[-1] == sizes[20] > 0  # the sliding layer stopped growing
    assert cache.layers[2].nbytes() > 3 * sizes[-1]  # the full layer did not


def test_generate_greedy_sampling_and_left_padded_batch(tiny_tokenizer):
    model = make_tiny_model("llama")
    plan = _plan(model, [("int8_per_token_head", "int8_per_token_head")] * 3, [{}] * 3)
    r = generate_with_plan(model, tiny_tokenizer, plan, ["The quick brown fox", "A"], max_new_tokens=6)
    assert len(r["texts"]) == 2 and r["tokens"] == 12 and r["cache_bytes"] > 0
    s = generate_with_plan(model, tiny_tokenizer, plan, ["The quick brown fox"], max_new_tokens=6, do_sample=True)
    assert s["tokens"] == 6


def test_plan_for_another_model_and_unstorable_schemes_are_refused():
    model = make_tiny_model("llama")
    plan = _plan(model, [("int4_c32", "int4_t32")] * 3, [{}] * 3)
    with pytest.raises(SensprofError, match="another model"):
        PlannedCache.from_plan(plan, make_tiny_model("llama", seed=1))
    pre = _plan(model, [("int4_c32_pre", "int4_t32")] * 3, [{}] * 3)
    with pytest.raises(SensprofError, match="cannot store"):
        PlannedCache.from_plan(pre, model)
    cal = _plan(model, [("fp8_e4m3_cal", "none")] * 3, [{}] * 3)
    with pytest.raises(SensprofError, match="calibrated"):
        PlannedCache.from_plan(cal, model)


def test_generate_cli_prints_text_bytes_and_speed(tiny_model_dir, tmp_path, capsys):
    from conftest import one_error_line, run_cli

    prof, plan = tmp_path / "p", tmp_path / "plan.json"
    assert run_cli(capsys, "profile", "--model", tiny_model_dir, "--seq-len", "32", "--windows", "2", "--schemes",
                   "int4_c32,int4_t32,int8_per_token_head", "--out", prof, "--device", "cpu", "--quiet")[0] == 0
    assert run_cli(capsys, "plan", prof, "--avg-bits", "8", "--out", plan)[0] == 0
    rc, out, err = run_cli(capsys, "generate", "--plan", plan, "--prompt", "The quick brown fox", "--prompt", "A",
                           "--max-new-tokens", "5", "--device", "cpu")
    assert rc == 0, err
    assert out.count("--- ") == 2 and "# cache:" in out and "tokens/s" in out and "2 sequences" in out
    from sensprof.runtime.kernels import cpu_kernels

    used = "cpu" if cpu_kernels.available() is None else "reference"
    assert f"{used} kernels read the packed cache" in out
    line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--kernels", "fastest"))
    assert "unknown kernel preference 'fastest'" in line
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--kernels", "triton",
                                       "--device", "cpu"))
        assert "Triton kernels need" in line
    line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--max-new-tokens", "0"))
    assert "--max-new-tokens" in line
    if not torch.cuda.is_available():
        line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--device", "cuda"))
        assert "CUDA is not available" in line


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"])
def test_packed_decode_only_where_attention_reads_through_the_interface(arch, monkeypatch):
    """The six families hand cached K/V straight to the attention interface; a model whose attention uses
    the cache's tensors itself keeps its own attention and gets tensors."""
    import sensprof.runtime.cache as cache_mod
    from sensprof.runtime.attention import reads_through_interface

    model = make_tiny_model(arch)
    assert reads_through_interface(model)
    plan = _plan(model, [("int4_c32", "int4_t32")] * len(describe_layers(model)), [{}] * len(describe_layers(model)))
    monkeypatch.setattr(cache_mod, "reads_through_interface", lambda m: False)
    cache = PlannedCache.from_plan(plan, model)
    assert model.config._attn_implementation == "eager" and not any(layer.packed for layer in cache.layers)
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(6))
    assert torch.isfinite(_decode(model, cache, ids)).all()


def test_a_head_dim_the_triton_tiles_cannot_span_is_read_densely():
    import types

    import transformers as tf

    from sensprof.runtime.kernels import reference

    cfg, _ = tiny_config("llama")
    cfg = tf.LlamaConfig(**{**cfg.to_dict(), "head_dim": 24, "num_hidden_layers": 1})
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).eval()
    plan = _plan(model, [("int4_c32", "int4_t32")], [{}])
    ids = torch.randint(3, 300, (1, 48), generator=torch.Generator().manual_seed(7))
    steps = {}
    for name, ops in (("reference", reference),
                      ("triton-like", types.SimpleNamespace(NEEDS_POWER_OF_TWO_HEAD_DIM=True,
                                                            decode_attention=reference.decode_attention))):
        cache = PlannedCache.from_plan(plan, model, kernels="reference")
        cache.layers[0].lazy_initialization(torch.zeros(1), None)
        cache.layers[0].kernels = ops
        _decode(model, cache, ids)
        steps[name] = cache.layers[0].packed_steps
    assert steps["reference"] > 0 and steps["triton-like"] == 0
