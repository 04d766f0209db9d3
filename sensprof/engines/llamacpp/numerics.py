"""llama.cpp's model numerics: every matmul with a quantized weight quantizes its input first.

ggml-cpu multiplies a quantized weight by an activation converted to the weight type's `vec_dot_type`
(ggml/src/ggml-cpu/ggml-cpu.c, type_traits_cpu): q8_0 blocks of 32 for Q4_0, Q5_0 and Q8_0 weights, q8_1 (the same
codes and fp16 scale, plus a block sum) for Q4_1 and Q5_1, q8_K blocks of 256 with a float32 scale for the K-quants;
F32 weights multiply float32 activations and F16 / BF16 ones activations rounded to that type. transformers
dequantizes the GGUF's weights exactly, so a float32 model with these activation roundings computes what llama.cpp
computes, up to summation order.

That rounding makes llama.cpp's model respond to a cache error more than the float32 model does: a small change
anywhere flips some activation codes, and the flips travel on. It is why llama.cpp measures a `q8_0` cache at ~10x
its float32 emulation, and why its f32 cache read along another path ("the floor") measures as much. Which codes
flip depends on the exact values, so one run is one draw: `realization` > 0 moves every activation by a relative
1e-6 before its rounding (engines/draws.py), giving another draw of the same numerics.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..draws import Dither
from .query import quantize_query_q8

# ggml type -> what its matmul does to the activation: a q8 block size, a float type, or None (kept float32)
VEC_DOT = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q8_1": 32, "IQ4_NL": 32,
           "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_K": 256, "IQ4_XS": 256,
           "F32": None, "F16": torch.float16, "BF16": torch.bfloat16}


def quantize_q8_k(x: torch.Tensor) -> torch.Tensor:
    """q8_K (ggml's quantize_row_q8_K_ref): per block of 256, codes round(x * -127 / max) with max the
    largest-magnitude value, capped at 127, scale its float32 inverse."""
    g = x.float().reshape(*x.shape[:-1], -1, 256)
    idx = g.abs().argmax(-1, keepdim=True)
    mx = g.gather(-1, idx)
    iscale = torch.where(mx != 0, -127.0 / torch.where(mx != 0, mx, 1.0), 0.0)
    codes = torch.round(g * iscale).clamp(max=127)
    scale = torch.where(iscale != 0, 1.0 / torch.where(iscale != 0, iscale, 1.0), 0.0)
    return (codes * scale).reshape(x.shape)


def round_activation(x: torch.Tensor, how) -> torch.Tensor:
    """The activation a ggml matmul of this kind multiplies (VEC_DOT's values), in x's dtype."""
    if how is None:
        return x
    if isinstance(how, torch.dtype):
        return x.to(how).to(x.dtype)
    if x.shape[-1] % how:  # ggml requires whole blocks; a model that breaks this is not one llama.cpp runs
        raise ValueError(f"a matmul input of width {x.shape[-1]} is not whole blocks of {how}")
    return (quantize_query_q8(x) if how == 32 else quantize_q8_k(x)).to(x.dtype)


def gguf_tensor_types(gguf_path: str) -> tuple[str, int, dict[str, str]]:
    """The GGUF's architecture, block count and each tensor's ggml type name."""
    from ...gguf_files import read_gguf

    reader = read_gguf(gguf_path)
    field = reader.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    blocks = reader.fields.get(f"{arch}.block_count")
    n = int(blocks.parts[blocks.data[0]][0]) if blocks is not None else 0
    return arch, n, {t.name: t.tensor_type.name for t in reader.tensors}


def matmul_roundings(model, gguf_path: str) -> dict[str, object]:
    """Per linear module of `model` (by name), what llama.cpp does to its input; "lm_head" for the output matmul
    (the output weight, or the token embedding it is tied to). Modules the GGUF has no tensor for are left out."""
    import gguf

    arch, n, types = gguf_tensor_types(gguf_path)
    code = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if code is None:
        raise ValueError(f"gguf does not know the architecture {arch!r}")
    names = gguf.get_tensor_name_map(code, n)
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is model.get_output_embeddings():
            continue
        mapped = names.get_name(name + ".weight", try_suffixes=(".weight",))
        if mapped in types:
            out[name] = VEC_DOT.get(types[mapped], 32)
    if not out:  # a model whose module names gguf cannot map would silently stay float32
        from ...errors import SensprofError

        raise SensprofError(f"none of {type(model).__name__}'s linear layers matches a tensor of {gguf_path}; "
                            "validate with the model loaded from that GGUF file (--model FILE.gguf)")
    head = types.get("output.weight", types.get("token_embd.weight"))
    if head is not None:
        out["lm_head"] = VEC_DOT.get(head, 32)
    return out


@contextmanager
def llamacpp_numerics(model, gguf_path: str, realization: int = 0):
    """Within: `model` rounds every matmul input as llama.cpp does with this GGUF (the LM head's through the
    decoder's final norm, whose output is what the head multiplies)."""
    roundings = matmul_roundings(model, gguf_path)
    dither = Dither(realization)
    modules = dict(model.named_modules())
    handles = []

    def rounded(x, how):
        return x if how is None else round_activation(dither(x), how)

    def pre(how):
        return lambda mod, args: (rounded(args[0], how), *args[1:])

    try:
        for name, how in roundings.items():
            if name != "lm_head":
                handles.append(modules[name].register_forward_pre_hook(pre(how)))
        norm = getattr(model.get_decoder(), "norm", None) if hasattr(model, "get_decoder") else None
        if "lm_head" in roundings and norm is not None:
            how = roundings["lm_head"]
            handles.append(norm.register_forward_hook(lambda mod, args, out: rounded(out, how)))
        yield roundings
    finally:
        for h in handles:
            h.remove()
