"""llama.cpp's matmul input rounding (engines/llamacpp/numerics.py): the q8_K quantizer against ggml's reference
rule, which rounding each linear module gets from a GGUF's tensor types, and the hooks that apply it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sensprof.engines.llamacpp.numerics import (VEC_DOT, llamacpp_numerics, matmul_roundings, quantize_q8_k,
                                                round_activation)
from tests.conftest import tiny_config

gguf = pytest.importorskip("gguf")

# bytes per block and elements per block of the types the fake GGUF below declares
BLOCK_BYTES = {"Q4_1": (20, 32), "Q4_K": (144, 256), "Q8_0": (34, 32), "F32": (4, 1)}


def _q8_k_reference(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref, element by element, then dequantized."""
    out = np.zeros_like(x, dtype=np.float32)
    for b in range(0, len(x), 256):
        blk = x[b:b + 256].astype(np.float32)
        mx = blk[np.argmax(np.abs(blk))]
        if mx == 0:
            continue
        iscale = np.float32(-127.0) / mx
        q = np.minimum(127, np.rint(iscale * blk))
        out[b:b + 256] = q * (np.float32(1) / iscale)
    return out


def test_q8_k_is_ggml_reference_rule():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 512, generator=g) * torch.tensor([1.0, 1e-3, 50.0, 1.0])[:, None]
    x[3, :256] = 0  # an all-zero block stays zero
    got = quantize_q8_k(x)
    want = np.stack([_q8_k_reference(r) for r in x.numpy()])
    assert torch.equal(got, torch.from_numpy(want))
    assert len(torch.unique(got[0, :256] / (got[0, :256].abs().max() / 127)).round()) <= 255


def test_round_activation_kinds():
    x = torch.randn(3, 64, dtype=torch.float32) * 3
    assert round_activation(x, None) is x
    assert torch.equal(round_activation(x, torch.float16), x.half().float())
    q = round_activation(x, 32)
    blocks = q.reshape(3, 2, 32)
    d = (x.reshape(3, 2, 32).abs().amax(-1, keepdim=True) / 127).half().float()
    codes = blocks / d
    assert torch.allclose(codes, codes.round(), atol=1e-4) and codes.abs().max() <= 127
    with pytest.raises(ValueError, match="not whole blocks of 256"):
        round_activation(x, 256)


def _fake_gguf(path, model, types):
    """A GGUF whose tensors carry the given ggml types (contents irrelevant: only the types are read)."""
    n = model.config.num_hidden_layers
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(n)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not model.get_output_embeddings():
            mapped = names.get_name(name + ".weight", try_suffixes=(".weight",))
            kind = types(mapped)
            nbytes, per = BLOCK_BYTES[kind]
            rows, cols = module.weight.shape
            cols = max(cols, per)
            data = np.zeros((rows, cols // per * nbytes), dtype=np.uint8)
            w.add_tensor(mapped, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    emb = model.get_input_embeddings().weight
    w.add_tensor("token_embd.weight", np.zeros((emb.shape[0], emb.shape[1] // 32 * 34), dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def tiny_with_gguf(tmp_path):
    config, cls = tiny_config("llama")
    config.intermediate_size = 256  # ffn_down's input: whole q8_K blocks
    torch.manual_seed(0)
    model = cls(config).eval()
    path = tmp_path / "tiny.gguf"
    _fake_gguf(path, model, lambda name: "Q4_K" if "ffn_down" in name else "F32" if "attn_v" in name else "Q4_1")
    return model, str(path)


def test_each_linear_gets_its_weight_types_rounding(tiny_with_gguf):
    model, path = tiny_with_gguf
    r = matmul_roundings(model, path)
    assert r["model.layers.0.self_attn.q_proj"] == VEC_DOT["Q4_1"] == 32
    assert r["model.layers.2.mlp.down_proj"] == VEC_DOT["Q4_K"] == 256
    assert r["model.layers.1.self_attn.v_proj"] is None  # an F32 weight multiplies float32 activations
    assert r["lm_head"] == 32  # no output.weight: the head is the token embedding (Q8_0)
    assert sum(1 for k in r if k != "lm_head") == 7 * model.config.num_hidden_layers


def test_a_model_the_gguf_does_not_describe_is_refused(tiny_with_gguf, tmp_path):
    from sensprof.errors import SensprofError

    model, _ = tiny_with_gguf
    other = tmp_path / "other.gguf"
    _fake_gguf(other, model, lambda name: "Q4_1")
    wrapper = torch.nn.Module()
    wrapper.inner = model  # module names gain a prefix gguf cannot map
    wrapper.get_output_embeddings = model.get_output_embeddings
    with pytest.raises(SensprofError, match="none of Module's linear layers matches a tensor of .*other.gguf"):
        matmul_roundings(wrapper, str(other))


def test_numerics_round_inputs_inside_and_leave_the_model_alone_after(tiny_with_gguf):
    model, path = tiny_with_gguf
    ids = torch.randint(3, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    seen = {}
    q_proj = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with llamacpp_numerics(model, path):
            probe = q_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("q", a[0].clone()))
            first = model(input_ids=ids).logits  # pre-hooks run in order: the probe sees the rounded input
            probe.remove()
        with llamacpp_numerics(model, path):
            again = model(input_ids=ids).logits
        with llamacpp_numerics(model, path, realization=1):
            other = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    q_in = seen["q"].reshape(-1, 32)
    d = (q_in.abs().amax(-1, keepdim=True) / 127).half().float()
    codes = q_in / d
    assert torch.allclose(codes, codes.round(), atol=1e-3) and codes.abs().max() <= 127.01
    assert not torch.equal(first, plain) and torch.equal(first, again)  # rounded, deterministically
    assert not torch.equal(other, first)  # another draw of the same numerics
    assert torch.equal(after, plain)  # nothing left behind


def test_emulation_in_llamacpps_numerics_averages_its_draws(tiny_with_gguf):
    """validate --engine llamacpp's emulation: each draw measured in the numerics, their per-token mean compared,
    every draw's mean kept, and the float32 model's own emulation beside it."""
    from types import SimpleNamespace

    from sensprof.artifacts import LayerPlan, Plan
    from sensprof.models import describe_layers, fingerprint
    from sensprof.validation.validate import measure
    from sensprof.validation.validate_engine import EngineRun, LLAMACPP_BASELINE, emulated_damage

    model, path = tiny_with_gguf
    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, "int4_c32", "int4_t32", 0.0, 0.0, {})
              for i in describe_layers(model)]
    run = EngineRun("plan", {}, Plan.hand_made("tiny", fingerprint(model), layers))
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    out = emulated_damage(SimpleNamespace(model=model), ids, [LLAMACPP_BASELINE, run], gguf=path, draws=3)["plan"]
    assert len(out.draws_kl) == 3 and len(set(out.draws_kl)) == 3 and len(out.draws_dnll) == 3
    assert float(out.kl.mean()) == pytest.approx(sum(out.draws_kl) / 3)
    assert float(out.dnll.mean()) == pytest.approx(sum(out.draws_dnll) / 3)
    plain = measure(model, ids, {"plan": layers}, per_token=True)["plan"]
    assert out.float_kl == pytest.approx(float(plain["kl_tokens"].mean()))
    assert torch.equal(out.float_dnll, plain["dnll_tokens"]) and float(out.kl.mean()) != pytest.approx(out.float_kl)
    # without the GGUF: draws of the float32 model's numerics, the first the model as it is
    without = emulated_damage(SimpleNamespace(model=model), ids, [LLAMACPP_BASELINE, run], draws=1)["plan"]
    assert len(without.draws_kl) == 1 and torch.equal(without.kl, plain["kl_tokens"]) and without.float_dnll is None
