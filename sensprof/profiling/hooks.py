"""Intercept attention through transformers' own interfaces, and always clean up.

sensprof registers an attention function named "sensprof" (AttentionInterface) that calls the
model's own eager attention, and lets a per-layer *tap* see or change the layer's cached K and V
(post-RoPE, exactly what a cache stores) on the way. No modeling file is forked.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from ..models import model_eager

ATTN_NAME = "sensprof"
_TAPS: dict[int, object] = {}  # id(attention module) -> tap
_FAST: dict[int, object] = {}  # id(attention module) -> transformers' SDPA, where it was checked to equal the eager one
_registered = False


QUERY_BLOCK = 1024  # queries per eager-attention call: long windows never hold [T, T] weights for all queries


def query_blocks(n_queries: int, mask) -> list[slice]:
    """Blocks of query positions for eager attention (one block when short, or when there is no mask to slice)."""
    if n_queries <= QUERY_BLOCK or mask is None:
        return [slice(0, n_queries)]
    return [slice(t, min(n_queries, t + QUERY_BLOCK)) for t in range(0, n_queries, QUERY_BLOCK)]


def blocked_eager(eager, module, query, key, value, mask, **kwargs):
    """The model's eager attention, a block of queries at a time (its weights are only returned when unblocked)."""
    blocks = query_blocks(query.shape[-2], mask)
    if len(blocks) == 1:
        return eager(module, query, key, value, mask, **kwargs)
    outs = [eager(module, query[..., b, :], key, value, mask[..., b, :], **kwargs)[0] for b in blocks]
    return torch.cat(outs, dim=1), None


def plain_attention(eager, module, query, key, value, mask, **kwargs):
    """Attention whose weights nobody reads: SDPA where it computes what the model's eager attention does
    (several times faster on long windows), else the eager attention a block of queries at a time."""
    fast = _FAST.get(id(module))
    if fast is not None:
        return fast(module, query, key, value, mask, **kwargs)
    return blocked_eager(eager, module, query, key, value, mask, **kwargs)


def _sensprof_attention(module, query, key, value, attention_mask, **kwargs):
    eager = model_eager(module)
    tap = _TAPS.get(id(module))
    if tap is None:
        return plain_attention(eager, module, query, key, value, attention_mask, **kwargs)
    return tap(eager, module, query, key, value, attention_mask, kwargs)


def register():
    """Make "sensprof" a valid attn_implementation (with the eager mask) for any model."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTN_NAME, _sensprof_attention)
    AttentionMaskInterface.register(ATTN_NAME, eager_mask)
    _registered = True


# ---------------------------------------------------------------- the context manager


@dataclass
class TapSession:
    """Holds what taps need between calls: each layer's RoPE (cos, sin) of the current forward."""

    model: object
    attn_modules: list
    rope: dict = field(default_factory=dict)
    fast: bool = False  # untapped attention runs SDPA (checked equal to the model's eager)

    def set_tap(self, layer: int, tap) -> None:
        _TAPS[id(self.attn_modules[layer])] = tap

    def clear_taps(self) -> None:
        for m in self.attn_modules:
            _TAPS.pop(id(m), None)


SDPA_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}  # max |sdpa - eager| / max |eager|; 3e-2 for 16-bit


def _checked_sdpa(model, session):
    """Transformers' SDPA attention where it computes this model's eager attention on a short probe, else None.

    Checked, not assumed: soft-capping, attention sinks or a remote model's own eager maths make them differ.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ..models import text_config

    sdpa = ALL_ATTENTION_FUNCTIONS.get("sdpa")
    if sdpa is None or not getattr(type(model), "_supports_sdpa", False) or model.training:
        return None
    if getattr(text_config(model), "attn_logit_softcapping", None) or any(
            getattr(m, "sinks", None) is not None for m in session.attn_modules):
        return None
    errors = []

    def probe(eager, module, query, key, value, mask, kwargs):
        out, w = eager(module, query, key, value, mask, **kwargs)
        try:
            alt = sdpa(module, query, key, value, mask, **kwargs)[0]
        except (ValueError, TypeError, RuntimeError):
            alt = None
        scale = float(out.abs().max()) or 1.0
        errors.append(float("inf") if alt is None or alt.shape != out.shape else float((alt - out).abs().max()) / scale)
        return out, w

    emb = model.get_input_embeddings()
    ids = torch.randint(0, emb.num_embeddings, (1, 40), generator=torch.Generator().manual_seed(0)).to(emb.weight.device)
    for i in range(len(session.attn_modules)):
        session.set_tap(i, probe)
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        session.clear_taps()
    tol = SDPA_TOLERANCE.get(emb.weight.dtype, 3e-2)
    return sdpa if len(errors) == len(session.attn_modules) and max(errors) <= tol else None


def layers_with_rope(model) -> list[bool]:
    """Which attention layers are given RoPE's position embeddings (a NoPE layer is given none): keys can be stored
    before RoPE only there. Two tokens through the model tell."""
    import torch

    device = model.get_input_embeddings().weight.device
    with attention_taps(model, fast=False) as session, torch.inference_mode():
        model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device), use_cache=False)
        return [session.rope.get(i) is not None for i in range(len(session.attn_modules))]


@contextlib.contextmanager
def attention_taps(model, fast: bool = True):
    """Route the model's attention through sensprof; restore everything on exit, even on error.

    `fast`: untapped attention (and taps that read no weights) runs transformers' SDPA where a probe finds it
    equal to the model's eager attention."""
    from ..models import decoder_layers

    register()
    layers = decoder_layers(model)
    attn_modules = [layer.self_attn for layer in layers]
    session = TapSession(model, attn_modules)
    handles = []

    def capture_rope(index):
        def hook(module, args, kwargs):
            pe = kwargs.get("position_embeddings")
            if pe is None and len(args) > 1:
                pe = args[1]
            # a NoPE layer is handed the position embeddings too and leaves them unused (SmolLM3's, Llama 4's
            # use_rope = 0)
            rotates = bool(getattr(module, "use_rope", True))
            session.rope[index] = pe if rotates and isinstance(pe, (tuple, list)) and len(pe) == 2 else None

        return hook

    previous = model.config._attn_implementation
    try:
        for i, m in enumerate(attn_modules):
            handles.append(m.register_forward_pre_hook(capture_rope(i), with_kwargs=True))
        model.set_attn_implementation(ATTN_NAME)
        sdpa = _checked_sdpa(model, session) if fast else None
        if sdpa is not None:
            for m in attn_modules:
                _FAST[id(m)] = sdpa
            session.fast = True
        session.rope.clear()
        yield session
    finally:
        session.clear_taps()
        for m in attn_modules:
            _FAST.pop(id(m), None)
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous)


def repeat_batch(x: torch.Tensor, times: int) -> torch.Tensor:
    """x repeated `times` along the batch: the layout of input_ids.repeat(times, 1) for batched variants."""
    return x if times == 1 else x.repeat(times, *([1] * (x.dim() - 1)))


@contextlib.contextmanager
def replay_from(model, start: int, layer_outputs: dict, repeat: int = 1):
    """Skip decoder layers before `start`: they return the recorded output of layer start-1.

    Layers before the perturbed one compute exactly the baseline, so recomputing them is waste.
    """
    from ..models import decoder_layers

    layers = decoder_layers(model)
    if start <= 0:
        yield
        return
    out = layer_outputs[start - 1]

    def repeated(o):
        if isinstance(o, torch.Tensor):
            return repeat_batch(o, repeat)
        if isinstance(o, tuple):
            return tuple(repeated(x) for x in o)
        return o

    cached = repeated(out)
    skipped = list(layers[:start])
    saved = [layer.__dict__.get("forward") for layer in skipped]  # every layer's, before any is replaced
    try:
        for layer in skipped:
            layer.forward = lambda *a, **k: cached
        yield
    finally:  # every layer back, whichever were replaced when an exception (Ctrl-C included) arrived
        for layer, fwd in zip(skipped, saved):
            if fwd is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = fwd


@contextlib.contextmanager
def record_layer_outputs(model, store: dict):
    from ..models import decoder_layers

    handles = []
    try:
        for i, layer in enumerate(decoder_layers(model)):
            def hook(module, args, output, i=i):
                store[i] = output.detach() if isinstance(output, torch.Tensor) else tuple(
                    o.detach() if isinstance(o, torch.Tensor) else o for o in output)
            handles.append(layer.register_forward_hook(hook))
        yield store
    finally:
        for h in handles:
            h.remove()
