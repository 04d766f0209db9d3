"""Storage cost of a scheme: the ONE formula every stage uses (profile, planner, runtime, export).

Imports no torch. Costs count codes, scales and zero-points; a per-tensor or per-head scale is a
constant per layer, and full-precision residual/sink tokens are stored at the model's 16 bits.
"""

from __future__ import annotations

import math

from .engines.vllm.catalog import bits_per_element as engine_bits
from .schemes import QuantScheme

MODEL_BITS = 16
CONSTANT_SCALE_BITS = 32  # one fp32 scale per layer (tensor) or per KV head (head)


def effective_group(scheme: QuantScheme, head_dim: int) -> int | None:
    """Channels (token granularity) or tokens (channel granularity) that share one scale."""
    if scheme.granularity == "token":
        return min(scheme.group or head_dim, head_dim)
    if scheme.granularity == "channel":
        return scheme.group
    return None


def bits_per_element(scheme: QuantScheme, head_dim: int) -> float:
    """Long-context average bits per cached element (codes + per-group scales and zero-points)."""
    if scheme.is_identity:
        return float(MODEL_BITS)
    if scheme.is_engine:  # an engine's own slot layout, as the engine allocates it
        return engine_bits(scheme, head_dim)
    g = effective_group(scheme, head_dim)
    per_scale = scheme.scale_bits + scheme.zero_bits
    if scheme.granularity == "token":
        return scheme.bits + math.ceil(head_dim / g) * per_scale / head_dim
    if scheme.granularity == "channel":
        return scheme.bits + per_scale / g
    return float(scheme.bits)


def quantized_token_count(scheme: QuantScheme, n_tokens: int) -> int:
    """Tokens held quantized after n_tokens were appended; the rest wait in full precision.

    Sinks stay full precision; the most recent `residual` tokens too; with per-channel groups a
    token is quantized only once its whole group of G tokens (counted from the first non-sink) is
    complete and has left the residual window.
    """
    if scheme.is_identity:
        return 0
    body = max(0, n_tokens - scheme.sink)
    q = max(0, body - scheme.residual)
    if scheme.granularity == "channel":
        q = (q // scheme.group) * scheme.group  # whole groups, each entirely out of the residual window
    return q


def layer_cache_bits(scheme: QuantScheme, n_tokens: int, kv_heads: int, head_dim: int) -> float:
    """Exact bits one layer's K (or V) cache holds after n_tokens, per sequence."""
    if scheme.is_identity:
        return float(n_tokens * kv_heads * head_dim * MODEL_BITS)
    q = quantized_token_count(scheme, n_tokens)
    full = n_tokens - q
    # Per-channel groups are only ever complete (see quantized_token_count), so the average is exact.
    bits = (q * bits_per_element(scheme, head_dim) + full * MODEL_BITS) * kv_heads * head_dim
    if scheme.granularity == "tensor" and scheme.scale_source != "unit":
        bits += CONSTANT_SCALE_BITS
    elif scheme.granularity == "head":
        bits += CONSTANT_SCALE_BITS * kv_heads
    return float(bits)


def tokens_held(n_tokens: int, kind: str | None, window: int | None) -> int:
    """Tokens a layer's cache holds after n_tokens: a sliding-window layer keeps only its window."""
    return min(n_tokens, int(window)) if kind == "sliding" and window else n_tokens


def layer_cache_bytes(scheme: QuantScheme, n_tokens: int, kv_heads: int, head_dim: int) -> int:
    return math.ceil(layer_cache_bits(scheme, n_tokens, kv_heads, head_dim) / 8)
