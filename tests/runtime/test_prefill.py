"""Prefill through the planned cache is exact: every prompt position reads K and V as the streaming cache held them
when it ran (the profiler's semantics), in one chunk or several."""

import pytest
import torch
from conftest import make_tiny_model
from runtime.plans import make_plan
from test_cache import _calibration, _fake_quant_logprobs

from sensprof.runtime import PlannedCache
from sensprof.runtime.generate import cache_kwarg

PAIRS = {
    "llama": [("int4_c32", "int4_t32"), ("int3_c32_r16_s4", "int5_t64"), ("q4_0", "fp8_e4m3")],
    "llama-vllm": [("int4_per_token_head", "int4_per_token_head"), ("fp8_e4m3_qfp8", "fp8_e4m3"),
                   ("int4_per_token_head", "int4_t32")],
    "llama-turboquant": [("turboquant_4bit_nc.K", "turboquant_4bit_nc.V"), ("turboquant_k8v4.K", "turboquant_k8v4.V"),
                         ("turboquant_k3v4_nc.K", "turboquant_3bit_nc.V")],
    "gemma3": [("int4_c32", "int4_t32"), ("int2_c32_s2", "int8_per_token_head"), ("int3_c32_r8", "int4_t32")],
}


def _prefill_logprobs(model, cache, ids, chunks):
    """Log-probabilities [B, T, V] of a prompt fed through `cache` in chunks of the given sizes."""
    out, at = [], 0
    with torch.no_grad():
        for n in chunks:
            out.append(model(ids[:, at:at + n], use_cache=True, **{cache_kwarg(model): cache}).logits)
            at += n
    assert at == ids.shape[1]
    return torch.cat(out, 1).log_softmax(-1)


@pytest.mark.parametrize("arch", ["llama", "llama-vllm", "llama-turboquant", "gemma3"])
@pytest.mark.parametrize("chunks", [[70], [33, 1, 36], [5, 40, 25]])
def test_prefill_reads_what_the_profiler_measured(arch, chunks, device):
    model = make_tiny_model(arch.split("-")[0]).to(device)
    ids = torch.randint(3, 300, (2, 70), generator=torch.Generator().manual_seed(2)).to(device)
    plan = make_plan(model, PAIRS[arch], _calibration(model, ids))
    ref = _fake_quant_logprobs(model, plan, ids)
    if arch == "gemma3":  # sliding layers (window 8) are exact until the window first slides
        ref, ids = ref[:, :8], ids[:, :8]
        chunks = [min(c, 8 - sum(chunks[:i])) for i, c in enumerate(chunks) if sum(chunks[:i]) < 8]
    cache = PlannedCache.from_plan(plan, model)
    run = _prefill_logprobs(model, cache, ids, chunks)
    with torch.no_grad():
        plain = model(ids, use_cache=False).logits.log_softmax(-1)
    assert (run - plain).abs().max() > 1e-3  # the quantization is real
    assert (run - ref).abs().max() < 1e-4


@pytest.mark.parametrize("chunks", [[700], [300, 1, 399]])
def test_long_prompts_read_what_the_profiler_measured_block_by_block(chunks, device):
    """Prompts longer than one query block (prefill.EXACT_QUERY_BLOCK): each block reads one version where all its
    queries agree and both over the band where they differ, with sinks, residual windows and key groups whose
    bands cross block edges, and a layer with an unquantized side."""
    from sensprof.runtime.prefill import EXACT_QUERY_BLOCK

    assert max(chunks) > EXACT_QUERY_BLOCK
    model = make_tiny_model("llama").to(device)
    ids = torch.randint(3, 300, (1, 700), generator=torch.Generator().manual_seed(6)).to(device)
    plan = make_plan(model, [("int3_c32_r16_s4", "int4_t32_r8"), ("int4_c128", "none"), ("none", "int2_t32_r40_s2")],
                     [{}] * 3)
    ref = _fake_quant_logprobs(model, plan, ids)
    run = _prefill_logprobs(model, PlannedCache.from_plan(plan, model), ids, chunks)
    with torch.no_grad():
        plain = model(ids, use_cache=False).logits.log_softmax(-1)
    assert (run - plain).abs().max() > 1e-3
    assert (run - ref).abs().max() < 1e-4


def test_a_chunk_end_read_is_not_what_the_profiler_measured(device):
    """Why the two versions: reading every prompt position against the cache as held at the chunk's end (a
    whole key group quantized for its own first tokens too) differs from the profile."""
    model = make_tiny_model("llama").to(device)
    ids = torch.randint(3, 300, (1, 64), generator=torch.Generator().manual_seed(3)).to(device)
    plan = make_plan(model, [("int2_c32", "none")] * 3, [{}] * 3)
    ref = _fake_quant_logprobs(model, plan, ids)
    exact = _prefill_logprobs(model, PlannedCache.from_plan(plan, model), ids, [64])
    chunk_end = _prefill_logprobs(model, PlannedCache.from_plan(plan, model, packed_decode=False), ids, [64])
    assert (exact - ref).abs().max() < 1e-4
    assert (chunk_end - ref).abs().max() > 1e-3  # over ten times the exact read's bound
