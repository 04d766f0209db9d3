"""vLLM checkpoint with calibrated per-layer FP8 KV scales, as llm-compressor writes them.

Weights are saved unchanged in safetensors; `model.layers.N.self_attn.k_scale` / `v_scale` go into an
extra safetensors file (added to the index when sharded) and config.json gets a compressed-tensors
`quantization_config.kv_cache_scheme`, so `vllm serve DIR --kv-cache-dtype fp8` loads the scales.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from ..errors import SensprofError
from ..plan import Plan

KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
SCALES_FILE = "kv_cache_scales.safetensors"
RECIPE_FILE = "llmcompressor_recipe.yaml"

RECIPE = """\
# llm-compressor recipe that reproduces sensprof's calibration: per-tensor FP8 (e4m3) K and V
# scales from absmax over calibration text. Use it with llmcompressor.oneshot(model=..., dataset=...,
# recipe="{name}"){ignore_note}
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      kv_cache_scheme:
        num_bits: 8
        type: float
        strategy: tensor
        dynamic: false
        symmetric: true
"""


def scale_prefix(model, layer: int) -> str:
    """The state-dict name of a layer's attention module (e.g. model.layers.3.self_attn)."""
    from ..models import decoder_layers

    attn = decoder_layers(model)[layer].self_attn
    for name, mod in model.named_modules():
        if mod is attn:
            return name
    raise SensprofError(f"cannot name the attention module of layer {layer}")


def write_checkpoint(plan: Plan, model, tokenizer, out_dir: str) -> str:
    import torch
    from safetensors.torch import save_file

    if plan.engine.get("kv_cache_dtype") not in ("fp8", "fp8_e4m3"):
        raise SensprofError(
            f"--write-checkpoint writes FP8 e4m3 scales, but this plan uses {plan.engine.get('kv_cache_dtype')!r}; "
            "drop --write-checkpoint (its scales are dynamic) or re-plan with an fp8 dtype")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SensprofError(f"--write-checkpoint {out_dir!r} exists and is not empty; pass a new directory")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-checkpoint-")
    try:
        qc = getattr(model.config, "quantization_config", None)
        if qc is not None:  # e.g. the GGUF loader's marker: the weights are already dequantized
            del model.config.quantization_config
        try:
            model.save_pretrained(tmp, safe_serialization=True)
        finally:
            if qc is not None:
                model.config.quantization_config = qc
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        skipped = set(plan.engine.get("skip_layers") or [])
        tensors = {}
        for p in plan.layers:
            if p.layer in skipped:
                continue
            prefix = scale_prefix(model, p.layer)
            tensors[f"{prefix}.k_scale"] = torch.tensor(plan.fp8_scale(p.layer, "K"), dtype=torch.float32)
            tensors[f"{prefix}.v_scale"] = torch.tensor(plan.fp8_scale(p.layer, "V"), dtype=torch.float32)
        save_file(tensors, os.path.join(tmp, SCALES_FILE), metadata={"format": "pt"})
        index = os.path.join(tmp, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                idx = json.load(f)
            idx["weight_map"].update({k: SCALES_FILE for k in tensors})
            with open(index, "w") as f:
                json.dump(idx, f, indent=2)
        cfg_path = os.path.join(tmp, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "dense",
                                      "quantization_status": "frozen", "config_groups": {}, "ignore": [],
                                      "kv_cache_scheme": dict(KV_CACHE_SCHEME)}
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2)
        note = (f"\n# sensprof's plan keeps layers {sorted(skipped)} at the model dtype: pass them to vLLM with "
                "--kv-cache-dtype-skip-layers.") if skipped else ""
        with open(os.path.join(tmp, RECIPE_FILE), "w") as f:
            f.write(RECIPE.format(name=RECIPE_FILE, ignore_note=note))
        if os.path.exists(out_dir):
            os.rmdir(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
