"""Replay only the positions a cell can change.

A streaming cache reads a token quantized only once its key group is complete and out of the residual
window, so the first p0 query positions of the quantized layer read exactly the baseline's keys and values,
and by causality every later layer computes the baseline there too. A cell whose p0 > 0 then runs in two
passes: the quantized layer over the whole window (its local metrics average over every query), then the
layers after it over positions p0.. only, each attending to the baseline's keys and values of the positions
before p0 as recorded in the baseline pass. Per-channel keys of 128-token groups move only half of a
256-token window.
"""

from __future__ import annotations

import contextlib

import torch

from .hooks import plain_attention, repeat_batch


class _Stop(Exception):
    """Raised by the hook on the quantized layer: the rest of the first pass is not needed."""


@contextlib.contextmanager
def stop_after(model, layer: int):
    """Run a forward only up to decoder layer `layer`; its output lands in the yielded dict's "out"."""
    from ..models import decoder_layers

    box: dict = {}

    def hook(module, args, output):
        box["out"] = output
        raise _Stop

    handle = decoder_layers(model)[layer].register_forward_hook(hook)
    try:
        yield box
    except _Stop:
        pass
    finally:
        handle.remove()


def positions_from(output, start: int):
    """A decoder layer's output (a tensor or a tuple led by one) for the positions start.. only."""
    if isinstance(output, torch.Tensor):
        return output[:, start:]
    return (output[0][:, start:],) + tuple(output[1:])


class PrefixRecorder:
    """In the baseline pass: each layer's cached keys and values of the first positions, and its attention mask."""

    def __init__(self, length: int):
        self.length = length
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.masks: dict[int, torch.Tensor | None] = {}

    def record(self, layer: int, key: torch.Tensor, value: torch.Tensor, mask) -> None:
        if self.length <= 0:
            return
        self.keys[layer] = key[..., : self.length, :].clone()
        self.values[layer] = value[..., : self.length, :].clone()
        self.masks[layer] = mask  # shared by the layers of one kind: a reference, not a copy

    def tap(self, layer: int, start: int, n: int) -> "PrefixTap":
        mask = self.masks[layer]
        key = self.keys[layer]
        if mask is None:
            neg = torch.finfo(key.dtype).min
            mask = torch.full((n, n), neg, dtype=key.dtype, device=key.device).triu(1)[None, None]
        return PrefixTap(self.keys[layer][..., :start, :], self.values[layer][..., :start, :],
                         mask[..., start:n, :n])


class PrefixTap:
    """A layer after the quantized one, over positions p0.. only: the baseline's keys and values before p0 in front."""

    def __init__(self, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor):
        self.key, self.value, self.mask = key, value, mask

    def __call__(self, eager, module, query, key, value, mask, kwargs):
        times = query.shape[0] // self.key.shape[0]
        k = torch.cat([repeat_batch(self.key, times).to(key.dtype), key], dim=-2)
        v = torch.cat([repeat_batch(self.value, times).to(value.dtype), value], dim=-2)
        m = self.mask
        if m.shape[0] not in (1, query.shape[0]):
            m = repeat_batch(m, query.shape[0] // m.shape[0])
        return plain_attention(eager, module, query, k, v, m, **kwargs)


def replay_suffix(model, session, layer: int, start: int, ids: torch.Tensor, layer_output, recorder: PrefixRecorder,
                  hidden_fn) -> torch.Tensor:
    """The final hidden states of positions start.. when decoder layer `layer` outputs `layer_output` and every
    earlier position is the baseline's. `hidden_fn(ids, position_ids)` runs the decoder."""
    from .hooks import replay_from
    from ..models import decoder_layers

    n = ids.shape[1]
    n_layers = len(decoder_layers(model))
    for i in range(layer + 1, n_layers):
        session.set_tap(i, recorder.tap(i, start, n))
    positions = torch.arange(start, n, device=ids.device)[None].expand(ids.shape[0], -1)
    try:
        with replay_from(model, layer + 1, {layer: positions_from(layer_output, start)}):
            return hidden_fn(ids[:, start:], positions)
    finally:
        session.clear_taps()
