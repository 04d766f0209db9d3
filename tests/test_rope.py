"""sensprof.rope: the RoPE maths the pre-RoPE taps undo and redo."""

from __future__ import annotations

import pytest
import torch

from sensprof.rope import apply_rope, undo_rope


def _rope_tables(t, rd, seed=0, base=10000.0):
    """cos/sin [1, T, rd] laid out as transformers builds them (two copies of the frequencies)."""
    inv = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos()[None].float(), emb.sin()[None].float()



@pytest.mark.parametrize("rd", [16, 8, 4])
def test_undo_rope_inverts_apply_rope(rd):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 40, 16, generator=g)
    cos, sin = _rope_tables(40, rd)
    y = apply_rope(x, cos, sin)
    # the rotation really changed the rotary part (position 0 is the identity rotation)...
    assert (y[..., 1:, :rd] - x[..., 1:, :rd]).abs().max() > 1e-2
    # ...and left the tail of a partial rotary as it was, bit for bit
    assert torch.equal(y[..., rd:], x[..., rd:])
    assert y.shape == x.shape
    torch.testing.assert_close(undo_rope(y, cos, sin), x, rtol=0, atol=1e-5)
    # rotations keep each pair's norm
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_apply_rope_matches_transformers_partial_rotary():
    """Phi-3's partial rotary (cos has head_dim/2 dims) done by transformers and by sensprof agree."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 24, 16, generator=g)
    k = torch.randn(1, 2, 24, 16, generator=g)
    cos, sin = _rope_tables(24, 8)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(apply_rope(k, cos, sin), k_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(apply_rope(q, cos, sin), q_ref, rtol=0, atol=1e-6)
