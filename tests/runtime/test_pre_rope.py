"""Keys stored before RoPE (`_pre`): the cache keeps pre-RoPE codes and rotates them back by their positions on every
read (the decode kernels' rope tables, the dense read's apply_rope), giving what the profiler measured."""

import pytest
import torch
from conftest import make_tiny_model
from runtime.plans import decode_logprobs, make_plan
from test_cache import _calibration, _decode_against_profile
from test_prefill import _prefill_logprobs

from sensprof.errors import SensprofError
from sensprof.runtime import PlannedCache

PAIRS = [("int4_c32_pre", "int4_t32"), ("int3_c32_pre_r16_s4", "none"), ("q4_0_pre", "int8_t32")]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "phi3", "gemma3"])  # phi3: partial rotary; gemma3: two RoPEs
def test_pre_rope_keys_decode_and_prefill_as_the_profiler_measured(arch, device):
    model = make_tiny_model(arch).to(device)
    ids = torch.randint(3, 300, (2, 70), generator=torch.Generator().manual_seed(1)).to(device)
    plan = make_plan(model, PAIRS, _calibration(model, ids))
    cache, run, ref, plain = _decode_against_profile(model, plan, ids)
    assert (run - plain).abs().max() > 1e-3
    # 2e-4: this tiny Qwen3 moves as much with post-RoPE keys (a code one rounding step away, not a RoPE effect)
    assert (run - ref).abs().max() < 2e-4
    assert all(layer.packed_steps == ids.shape[1] for layer in cache.layers)
    n = 8 if arch == "gemma3" else 70  # gemma3's sliding layers (window 8) are exact until the window slides
    pre = _prefill_logprobs(model, PlannedCache.from_plan(plan, model), ids[:, :n], [3, 1, n - 4])
    assert (pre - ref[:, :n]).abs().max() < 2e-4
    assert len(cache.rope_tables) == (2 if arch == "gemma3" else 1)  # one per kind of layer, shared
    table = cache.rope_tables[0]
    assert table.length == ids.shape[1] and cache.nbytes() > sum(layer.nbytes() for layer in cache.layers)


def test_pre_rope_needs_the_model_and_a_rotate_half_rope(monkeypatch):
    model = make_tiny_model("llama")
    plan = make_plan(model, PAIRS, [{}] * 3)
    with pytest.raises(SensprofError, match="needs the model"):
        PlannedCache.from_plan(plan)
    cache = PlannedCache.from_plan(plan, model)
    attn = model.model.layers[0].self_attn
    attn.sensprof_rope_hook.remove()  # an attention that is handed no position embeddings
    attn.sensprof_rope_hook = attn.register_forward_pre_hook(lambda m, a, kw: setattr(m, "sensprof_rope", None),
                                                             with_kwargs=True)
    with pytest.raises(SensprofError, match="layer 0: the model passes no RoPE tables"):
        decode_logprobs(model, cache, torch.randint(3, 300, (1, 4)))

    def interleaved(m, a, kw):  # GPT-J style tables: not each frequency in both halves
        cos, sin = kw["position_embeddings"]
        h = cos.shape[-1] // 2
        m.sensprof_rope = (cos[..., :h].repeat_interleave(2, -1), sin[..., :h].repeat_interleave(2, -1))

    attn.sensprof_rope_hook.remove()
    attn.sensprof_rope_hook = attn.register_forward_pre_hook(interleaved, with_kwargs=True)
    with pytest.raises(SensprofError, match="not transformers' rotate-half form"):
        decode_logprobs(model, PlannedCache.from_plan(plan, model), torch.randint(3, 300, (1, 4)))
