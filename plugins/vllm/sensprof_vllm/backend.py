"""SENSPROF_KV: a vLLM attention backend for a layer whose Keys and Values are stored in their own formats.

A pure-PyTorch implementation (it runs wherever torch runs; the plugin serves it on vLLM's CPU backend). vLLM hands a
layer's cache as a [blocks, kv_heads, block_size, bytes] uint8 view: customize_spec makes the layer's spec a packed
one (state_content_bytes = K's bytes + V's bytes per token-head; formats.py), so vLLM's own allocator sizes and
places the page. The cache update writes each new token's K and V codes at its slot; attention reads back every
cached token of a request (the current step's included, as vLLM reads its own caches), decodes it to float32 and
attends causally (within the layer's sliding window, if any) with the layer's scale, soft cap and GQA head mapping. One class per (K, V) pair, made once and
kept in this module, because customize_spec sees only the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionType, \
    MultipleOf
from vllm.v1.kv_cache_interface import KVCacheLayout

from .formats import Component
from .plan import pair_components

NAME = "SENSPROF_KV"


@dataclass
class SensprofKVMetadata:
    num_actual_tokens: int
    num_reqs: int
    query_start_loc: torch.Tensor  # [reqs + 1], host
    seq_lens: torch.Tensor  # [reqs], host
    block_table: torch.Tensor  # [reqs, max blocks]
    slot_mapping: torch.Tensor


class SensprofKVMetadataBuilder(AttentionMetadataBuilder[SensprofKVMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False) -> SensprofKVMetadata:
        m = common_attn_metadata
        return SensprofKVMetadata(int(m.num_actual_tokens), int(m.num_reqs), m.query_start_loc_cpu.cpu(),
                                  m.seq_lens.cpu(), m.block_table_tensor, m.slot_mapping)


class SensprofKVImpl(AttentionImpl):
    key: Component  # set on each pair's subclass
    value: Component

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                 logits_soft_cap=None, attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 **extra):
        from .plan import PlanError

        if alibi_slopes is not None or attn_type != AttentionType.DECODER \
                or kv_sharing_target_layer_name is not None or extra.get("sinks") is not None:
            raise PlanError("a layer with Keys and Values in their own formats must be decoder self-attention "
                            "(no ALiBi, sinks or shared KV); re-plan it with one of vLLM's dtypes")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap or 0.0
        # a query at p sees keys p - window < k <= p (vLLM's and HF's rule); served on a tiny Gemma 3 where vLLM pads
        # nothing (plan.py check_pool; docs/vllm-plugin.md)
        self.sliding_window = sliding_window
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = None
        self.model_dtype = torch.get_default_dtype()
        self.key_bytes = self.key.nbytes(head_size, self.model_dtype)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        n = slot_mapping.shape[0]
        slots = slot_mapping.long()
        valid = slots >= 0
        block_size = kv_cache.shape[2]
        slots, k, v = slots[valid], key[:n][valid], value[:n][valid]
        blocks, offsets = slots // block_size, slots % block_size
        kv_cache[blocks, :, offsets, :self.key_bytes] = self.key.write(k)
        kv_cache[blocks, :, offsets, self.key_bytes:] = self.value.write(v)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported by SENSPROF_KV")
        if attn_metadata is None:  # warm-up
            return output
        m = attn_metadata
        starts = m.query_start_loc.tolist()
        seq_lens = m.seq_lens.tolist()
        _, heads, block_size, _ = kv_cache.shape
        rep = self.num_heads // self.num_kv_heads
        d = self.head_size
        for i in range(m.num_reqs):
            q0, q1, s = starts[i], starts[i + 1], seq_lens[i]
            t = q1 - q0
            if t <= 0 or s <= 0:
                continue
            # the blocks this step's queries see: from the first key of the earliest query's window (vLLM may have
            # released the blocks before it, their table entries then name the null block)
            first = 0 if self.sliding_window is None else max(0, s - t - self.sliding_window + 1) // block_size
            nb = -(-s // block_size)
            pages = kv_cache[m.block_table[i, first:nb].long()]  # [nb - first, H, N, C]
            start = first * block_size
            pages = pages.permute(1, 0, 2, 3).reshape(heads, (nb - first) * block_size, -1)[:, :s - start]
            k = self.key.read(pages[..., :self.key_bytes], d, self.model_dtype).float()  # [H, s, D]
            v = self.value.read(pages[..., self.key_bytes:], d, self.model_dtype).float()
            q = query[q0:q1].float().reshape(t, heads, rep, d).permute(1, 2, 0, 3)  # [H, rep, t, D]
            scores = torch.matmul(q, k.unsqueeze(1).transpose(-1, -2)) * self.scale  # [H, rep, t, s]
            if self.logits_soft_cap:
                scores = self.logits_soft_cap * torch.tanh(scores / self.logits_soft_cap)
            pos = torch.arange(s - t, s).unsqueeze(1)
            keys = torch.arange(start, s).unsqueeze(0)
            hidden = keys > pos
            if self.sliding_window is not None:
                hidden |= keys <= pos - self.sliding_window
            scores = scores.masked_fill(hidden, float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1), v.unsqueeze(1))  # [H, rep, t, D]
            output[q0:q1] = out.permute(2, 0, 1, 3).reshape(t, self.num_heads, d).to(output.dtype)
        return output


class SensprofKVBackend(AttentionBackend):
    """The registered class (vLLM resolves the name SENSPROF_KV to it); each layer gets its pair's subclass."""

    forward_includes_kv_cache_update = False
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto"]
    key: Component | None = None
    value: Component | None = None

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(1)]

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBHNC,)

    @staticmethod
    def get_impl_cls():
        return SensprofKVImpl

    @staticmethod
    def get_builder_cls():
        return SensprofKVMetadataBuilder

    @classmethod
    def customize_spec(cls, spec):
        if cls.key is None or spec.state_content_bytes is not None:
            return spec
        content = cls.key.nbytes(spec.head_size, spec.dtype) + cls.value.nbytes(spec.head_size_v, spec.dtype)
        return replace(spec, dtype=torch.uint8, state_content_bytes=content)


_backends: dict[str, type] = {}


def backend_for(dtype: str) -> type:
    """The backend class of an asymmetric layer's name ("k:<K>/v:<V>"), made once per process."""
    if dtype not in _backends:
        k, v = (Component.parse(c) for c in pair_components(dtype))
        tag = f"{k.name}_{v.name}"
        impl = type(f"SensprofKVImpl_{tag}", (SensprofKVImpl,), {"key": k, "value": v, "__module__": __name__})
        backend = type(f"SensprofKVBackend_{tag}", (SensprofKVBackend,),
                       {"key": k, "value": v, "__module__": __name__,
                        "get_impl_cls": staticmethod(lambda impl=impl: impl)})
        globals()[impl.__name__] = impl  # found by name, as vLLM finds classes
        globals()[backend.__name__] = backend
        _backends[dtype] = backend
    return _backends[dtype]


def register() -> None:
    """Make the name SENSPROF_KV known to vLLM's backend registry (Attention.__init__ looks its backend up by name)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if NAME not in AttentionBackendEnum._member_map_:
        register_backend(NAME, f"{__name__}.SensprofKVBackend")
