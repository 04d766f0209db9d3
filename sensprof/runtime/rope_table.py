"""Position tables for keys stored before RoPE (`_pre` schemes): the store keeps pre-RoPE codes, and every read
rotates them back by their positions' cos / sin, exactly as the profiler's taps undo, quantize and re-apply RoPE.

One table per kind of layer (a model's sliding layers may use another RoPE), shared by its layers: the cos / sin
the model hands its attention for each new position, kept once as half tables (transformers' rotate-half RoPE
repeats each frequency in both halves), float32 [B, T, R / 2] (R the rotary dims). The model's attention modules
hand them over through a forward pre-hook (capture_position_embeddings).
"""

from __future__ import annotations

import torch

from ..errors import SensprofError
from .store import GrowingBuffer


class RopeTable:
    def __init__(self):
        self._cos, self._sin = GrowingBuffer(1), GrowingBuffer(1)

    @property
    def length(self) -> int:
        return self._cos.length

    def extend(self, cos: torch.Tensor, sin: torch.Tensor, total: int, layer: int) -> None:
        """cos / sin [B, n, R] of the last n of `total` positions, from the model; appends the positions it lacks."""
        new = total - self.length
        if new <= 0:
            return
        if new > cos.shape[-2]:
            raise SensprofError(f"layer {layer}: the keys of {new} positions came without their RoPE tables; "
                                "keys stored before RoPE (_pre) need the position embeddings of every token")
        cos, sin = cos[..., -new:, :], sin[..., -new:, :]
        h = cos.shape[-1] // 2
        if cos.shape[-1] % 2 or not (torch.equal(cos[..., :h], cos[..., h:2 * h])
                                     and torch.equal(sin[..., :h], sin[..., h:2 * h])):
            raise SensprofError(f"layer {layer}: the model's RoPE is not transformers' rotate-half form (each "
                                "frequency in both halves), which keys stored before RoPE (_pre) are read with; "
                                "re-plan without _pre key schemes")
        self._cos.append(cos[..., :h].float())
        self._sin.append(sin[..., :h].float())

    def halves(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 (cos, sin) [B, hi - lo, R / 2] of positions [lo, hi): views, as the kernels take them."""
        return self._cos.view()[:, lo:hi], self._sin.view()[:, lo:hi]

    def full(self, lo: int, hi: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, hi - lo, R] in the model's dtype: the tensors the model itself passed (exactly)."""
        c, s = self.halves(lo, hi)
        return torch.cat([c, c], dim=-1).to(dtype), torch.cat([s, s], dim=-1).to(dtype)

    def nbytes(self) -> int:
        return self._cos.nbytes() + self._sin.nbytes()


def capture_position_embeddings(attention_module) -> None:
    """Keep the (cos, sin) each call of this attention module receives on the module (`sensprof_rope`), for the
    cache's update to read; registered once per module."""
    if getattr(attention_module, "sensprof_rope_hook", None) is not None:
        return

    def hook(module, args, kwargs):
        pe = kwargs.get("position_embeddings")
        if pe is None and len(args) > 1:
            pe = args[1]
        module.sensprof_rope = pe if isinstance(pe, (tuple, list)) and len(pe) == 2 else None

    attention_module.sensprof_rope_hook = attention_module.register_forward_pre_hook(hook, with_kwargs=True)
