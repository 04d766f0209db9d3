"""llama.cpp's KV cache types as sensprof sees them (no torch): the block codecs are sensprof's own (schemes.py:
q8_0, q4_0, q4_1, q5_0, q5_1, bit-exact with ggml's), and for keys a variant whose query is quantized too, as
ggml-cpu's attention does (query.py): `<type>_qq8`."""

from __future__ import annotations

CACHE_TYPES = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")


def key_scheme(cache_type: str) -> str:
    """The scheme of a -ctk cache type: its codec, with the query llama.cpp quantizes beside it."""
    return f"{cache_type}_qq8" if cache_type in CACHE_TYPES else cache_type


def engine_schemes() -> list[dict]:
    """QuantScheme fields (schemes.py registers them): each cache type's key variant."""
    return [dict(like=t, name=key_scheme(t), tensor="K", query="llamacpp.q8",
                 description="query quantized to 8-bit blocks of 32 (llama.cpp's CPU attention: the key type's "
                             "vec_dot_type, q8_0 or q8_1)") for t in CACHE_TYPES]
