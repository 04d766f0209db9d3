"""llama.cpp's KV cache types as sensprof sees them (no torch): the block codecs are sensprof's own (schemes.py:
q8_0, q4_0, q4_1, q5_0, q5_1, bit-exact with ggml's), wrapped in what llama.cpp's attention does around them
(src/llama-kv-cache.cpp and llama-graph.cpp, as built by llama-cpp-python 0.3.36; checked on the engine's stored
cache bytes, tests/engines/test_llamacpp_cache.py):

- a quantized K cache: the query and the key are Hadamard-rotated (the largest power-of-two block >= 64 dividing
  head_dim) before the key is stored, and ggml-cpu's attention quantizes the rotated query to the key type's
  `vec_dot_type` (query.py): `llamacpp_<type>.K`, or `llamacpp_<type>.K_interleaved` for a Llama-family GGUF, whose
  converter stores q/k channels with rotary pairs adjacent (rotation.py);
- a quantized V cache: the value is rotated in blocks of 64 and the attention output rotated back:
  `llamacpp_<type>.V`.
A head_dim that 64 does not divide is not rotated. LLAMA_ATTN_ROT_DISABLE=1 turns the rotation off in llama.cpp;
sensprof prices the default."""

from __future__ import annotations

CACHE_TYPES = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
CHANNEL_ORDERS = ("halves", "interleaved")
# transformers model classes whose GGUF (convert_hf_to_gguf.py, LlamaModel.modify_tensors) permutes attn_q/attn_k
# into llama.cpp's interleaved rotary order; every other family keeps the checkpoint's order
INTERLEAVED_CLASSES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")


def channel_order(model_class: str | None) -> str:
    """The key channel order llama.cpp holds for a model of this transformers class."""
    return "interleaved" if model_class in INTERLEAVED_CLASSES else "halves"


def key_scheme(cache_type: str, order: str = "halves") -> str:
    """The scheme of a -ctk cache type for keys in this channel order."""
    if cache_type not in CACHE_TYPES:
        return cache_type
    return f"llamacpp_{cache_type}.K" + ("_interleaved" if order == "interleaved" else "")


def value_scheme(cache_type: str) -> str:
    return f"llamacpp_{cache_type}.V" if cache_type in CACHE_TYPES else cache_type


def engine_schemes() -> list[dict]:
    """QuantScheme fields (schemes.py registers them): each cache type's key variants and value."""
    out = []
    for t in CACHE_TYPES:
        for order in CHANNEL_ORDERS:
            out.append(dict(like=t, name=key_scheme(t, order), tensor="K", query="llamacpp.q8", rotation="hadamard_keys",
                            channel_order=order,
                            description=f"llama.cpp -ctk {t}: Hadamard-rotated keys ({order} channel order), the "
                                        "rotated query quantized to 8-bit blocks of 32 (ggml-cpu's vec_dot_type)"))
        out.append(dict(like=t, name=value_scheme(t), tensor="V", rotation="hadamard64",
                        description=f"llama.cpp -ctv {t}: values Hadamard-rotated in blocks of 64"))
    return out
