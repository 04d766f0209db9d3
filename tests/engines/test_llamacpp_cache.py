"""llama.cpp's quantized KV cache, against the rows the engine itself stored.

The fixtures (tests/data/llamacpp/*_layer0_rows.npz) hold layer 0's K and V rows of 16 tokens as llama-cpp-python
0.3.36 stored them for each cache type (tools/llamacpp_golden/cache_rows.py), on both real models: the default
(head_dim 64, a Llama-family GGUF whose key channels are interleaved) and Gemma 3 270M (head_dim 256: keys rotate
in one 256-wide block, values in 64-wide ones; transformers' key order; layer 0 in its sliding-window cache). The
f32 cache's rows are the input, and every quantized type's rows must be exactly what sensprof's scheme for that
type writes. They are: llama.cpp rotates K (and its query) and V by a Hadamard matrix before storing them
(engines/llamacpp/catalog.py), in the GGUF's key order; without the rotation, or in another channel order, they
are not. Where the engine is installed the live test dumps the default model's rows again."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from sensprof.engines.llamacpp.catalog import CACHE_TYPES, key_scheme, value_scheme
from sensprof.quant import fake_quant
from sensprof.rotation import interleave_order, rotate
from sensprof.schemes import get_scheme

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DATA = os.path.join(ROOT, "tests", "data", "llamacpp", "smollm2_layer0_rows.npz")
# fixture: (KV heads, head_dim, the GGUF's key channel order)
MODELS = {"smollm2_layer0_rows.npz": (3, 64, "interleaved"), "gemma3_layer0_rows.npz": (1, 256, "halves")}
HEADS, DIM = MODELS["smollm2_layer0_rows.npz"][:2]


def _bhtd(rows: np.ndarray, cache_type: str, heads: int = HEADS, dim: int = DIM) -> torch.Tensor:
    """Stored rows [tokens, bytes] as the float32 values they hold, [1, heads, tokens, head_dim]."""
    if cache_type == "f32":
        x = rows.copy().view(np.float32)
    else:
        x = dequantize(rows, getattr(GGMLQuantizationType, cache_type.upper()))
    return torch.from_numpy(x.reshape(len(rows), heads, dim).transpose(1, 0, 2).copy())[None]


def _stored_by_sensprof(rows: dict, cache_type: str, tensor: str, heads: int = HEADS, dim: int = DIM,
                        order: str = "interleaved") -> torch.Tensor:
    """What sensprof's scheme for the type stores, in the engine's basis (rotated, its channel order)."""
    x = _bhtd(rows[f"f32.{tensor}"], "f32", heads, dim)
    if tensor == "K":
        if order == "interleaved":  # the engine's order -> transformers' (what sensprof sees)
            x = x[..., torch.argsort(interleave_order(dim))]
        s = get_scheme(key_scheme(cache_type, order))
    else:
        s = get_scheme(value_scheme(cache_type))
    return rotate(fake_quant(x, s), s.rotation, s.channel_order)


def _check(rows: dict, heads: int = HEADS, dim: int = DIM, order: str = "interleaved") -> None:
    for t in CACHE_TYPES:
        for tensor in "KV":
            want = _bhtd(rows[f"{t}.{tensor}"], t, heads, dim)
            got = _stored_by_sensprof(rows, t, tensor, heads, dim, order)
            # compared in the rotated basis, the scheme's values pass the rotation twice in float32 (256-wide
            # sums for Gemma): that round-off, thousands of times below a q8_0 code step, is allowed
            atol = 2e-6 * float(want.abs().max())
            assert torch.allclose(got, want, rtol=0, atol=atol), (t, tensor, float((got - want).abs().max()))


@pytest.mark.parametrize("fixture", sorted(MODELS))
def test_every_cache_type_stores_what_the_scheme_writes(fixture):
    heads, dim, order = MODELS[fixture]
    _check(dict(np.load(os.path.join(ROOT, "tests", "data", "llamacpp", fixture))), heads, dim, order)


def test_gemma_keys_rotate_in_one_block_of_head_dim():
    """Gemma's 256-wide head: a key rotated in 64-wide blocks (the value's rotation) is not what llama.cpp stored."""
    rows = dict(np.load(os.path.join(ROOT, "tests", "data", "llamacpp", "gemma3_layer0_rows.npz")))
    heads, dim, _ = MODELS["gemma3_layer0_rows.npz"]
    want = _bhtd(rows["q4_0.K"], "q4_0", heads, dim)
    x = _bhtd(rows["f32.K"], "f32", heads, dim)
    v = get_scheme(value_scheme("q4_0"))
    assert (rotate(fake_quant(x, v), v.rotation, v.channel_order) - want).abs().max() > 0.5


def test_without_the_rotation_or_in_transformers_order_it_would_not():
    """The rotation and the GGUF's channel order are what make the match: the plain codec, or the keys rotated in
    transformers' order, store other values."""
    rows = dict(np.load(DATA))
    want = _bhtd(rows["q4_0.K"], "q4_0")
    plain = fake_quant(_bhtd(rows["f32.K"], "f32"), get_scheme("q4_0"))
    assert (plain - want).abs().max() > 1.0
    x = _bhtd(rows["f32.K"], "f32")  # the engine's order, taken for transformers'
    s = get_scheme(key_scheme("q4_0", "halves"))
    got = rotate(fake_quant(x, s), s.rotation, s.channel_order)
    assert torch.allclose(got, want, atol=1e-6)  # halves order on a tensor already in the engine's order: the same
    wrong = rotate(fake_quant(x[..., torch.argsort(interleave_order(DIM))], s), s.rotation, s.channel_order)
    assert (wrong - want).abs().max() > 1.0


@pytest.mark.engines
def test_live_llamacpp_stores_the_fixture(tmp_path, llamacpp_python):
    """Dump the rows again with the installed engine: a build that stores otherwise fails here."""
    from sensprof.validation.validate_engine import gguf_path

    fixture = dict(np.load(DATA))
    out = tmp_path / "rows.npz"
    tokens = ",".join(str(int(t)) for t in fixture["tokens"])
    subprocess.run([llamacpp_python, os.path.join(ROOT, "tools", "llamacpp_golden", "cache_rows.py"),
                    gguf_path("smollm2-135m"), tokens, str(out)], check=True, capture_output=True, timeout=600)
    live = dict(np.load(out))
    _check(live)
    for name, rows in fixture.items():
        assert np.array_equal(live[name], rows), name
