"""Packed decode attention (attention.py with PlannedLayer.packed_decode): the same tokens as the dense path,
and only where the kernel and the model's attention allow it."""

import pytest
import torch
from conftest import make_tiny_model
from runtime.plans import decode_logprobs, make_plan

from sensprof.models import describe_layers
from sensprof.runtime import PlannedCache
from sensprof.runtime.generate import generate_with_plan


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_decode_reads_the_same_cache_as_the_dense_path(arch, device):
    """Residual windows, sinks, different K and V lengths and group sizes: the kernel reads the packed
    positions both hold, the rest goes in its full-precision tail; the result is the dense path's."""
    model = make_tiny_model(arch).to(device)
    pairs = [("int4_c32_r16_s2", "int2_t32_s3"), ("int3_c64", "int4_t32_r8"), ("int8_c32", "int5_t32")]
    plan = make_plan(model, pairs, [{}] * 3)
    ids = torch.randint(3, 300, (2, 150), generator=torch.Generator().manual_seed(4)).to(device)
    dense = decode_logprobs(model, PlannedCache.from_plan(plan, packed_decode=False), ids)
    cache = PlannedCache.from_plan(plan, model, kernels="reference")
    packed = decode_logprobs(model, cache, ids)
    assert model.config._attn_implementation.startswith("sensprof_planned_")
    assert all(layer.packed_steps > 60 for layer in cache.layers)
    # cuBLAS sums the dense path's fp32 products in another order than the CPU: 70 steps through 3 layers move
    # log-probabilities of ~6 by 7e-5 on an H200
    assert (packed - dense).abs().max() < (1e-5 if device.type == "cpu" else 2e-4)


def test_packed_decode_reads_every_layout_and_a_left_padded_batch_as_the_dense_read_does(tiny_tokenizer,
                                                                                         monkeypatch):
    """fp8 keys, per-token keys and per-channel values, and a left-padded batch (whose mask hides the padding)
    all decode through the packed kernel, and give the tokens of the same cache read densely at each step."""
    from sensprof.runtime.cache import PlannedLayer

    model = make_tiny_model("llama")
    plan = make_plan(model, [("fp8_e4m3", "int4_t32"), ("int4_c32", "int4_t32"), ("int4_t32", "int4_c32")], [{}] * 3)
    prompts = ["the cat sat on the mat " * 6, "hello"]
    got = generate_with_plan(model, tiny_tokenizer, plan, prompts, max_new_tokens=12)
    assert got["packed_steps"] == 11 * 3  # every decode step of every layer (the first token comes from prefill)
    monkeypatch.setattr(PlannedLayer, "packed_decode", lambda self, *args: None)
    want = generate_with_plan(make_tiny_model("llama"), tiny_tokenizer, plan, prompts, max_new_tokens=12)
    assert want["packed_steps"] == 0
    assert torch.equal(got["ids"], want["ids"])


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"])
def test_packed_decode_only_where_attention_reads_through_the_interface(arch, monkeypatch):
    """The six families hand cached K/V straight to the attention interface; a model whose attention uses
    the cache's tensors itself keeps its own attention and gets tensors."""
    import sensprof.runtime.cache as cache_mod
    from sensprof.runtime.attention import reads_through_interface

    model = make_tiny_model(arch)
    assert reads_through_interface(model)
    n = len(describe_layers(model))
    plan = make_plan(model, [("int4_c32", "int4_t32")] * n, [{}] * n)
    monkeypatch.setattr(cache_mod, "reads_through_interface", lambda m: False)
    cache = PlannedCache.from_plan(plan, model)
    assert model.config._attn_implementation == "eager" and not any(layer.packed for layer in cache.layers)
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(6))
    assert torch.isfinite(decode_logprobs(model, cache, ids)).all()
