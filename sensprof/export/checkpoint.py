"""A bf16 model directory vLLM can serve, with calibrated per-layer FP8 KV scales as llm-compressor writes them.

Weights go to bf16 safetensors (a GGUF model's dequantized weights included: vLLM cannot load GGUF). For an
FP8 e4m3 plan `model.layers.N.self_attn.k_scale` / `v_scale` go into an extra safetensors file (added to the
index when sharded) and config.json gets a compressed-tensors `quantization_config.kv_cache_scheme`, so
`vllm serve DIR --kv-cache-dtype fp8_e4m3` loads them. Other dtypes (e5m2, per-token-head, ...) quantize
with dynamic or unit scales, so their directory holds the model only and the dtype stays on the command line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile

from ..errors import SensprofError
from ..artifacts import Plan

KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
SCALES_FILE = "kv_cache_scales.safetensors"
RECIPE_FILE = "llmcompressor_recipe.yaml"

SCALED_DTYPES = ("fp8", "fp8_e4m3")  # vLLM dtypes that read per-layer k_scale/v_scale from the checkpoint
# static_minmax keeps the running min/max over every calibration batch: absmax over all calibration text, as
# sensprof measures it ("minmax" is a moving average; llmcompressor/observers/min_max.py)
OBSERVER = "static_minmax"

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
        observer: {observer}
"""


def scale_prefix(model, layer: int) -> str:
    """The state-dict name of a layer's attention module (e.g. model.layers.3.self_attn)."""
    from ..models import decoder_layers

    attn = decoder_layers(model)[layer].self_attn
    for name, mod in model.named_modules():
        if mod is attn:
            return name
    raise SensprofError(f"cannot name the attention module of layer {layer}")


def has_scales(plan: Plan) -> bool:
    """Scales go into the checkpoint only for a plan priced with them: a unit-scale fp8 plan gets none, since a
    kv_cache_scheme makes vLLM quantize with those scales (and even under --kv-cache-dtype auto)."""
    return plan.engine.kv_cache_dtype in SCALED_DTYPES and bool(plan.engine.needs_scales)


@contextlib.contextmanager
def _plain_model(model):
    """Save a GGUF-loaded model as ordinary weights: transformers refuses to save while `hf_quantizer` is set,
    but the GGUF loader has already dequantized every weight, so the marker is dropped for the save."""
    quantizer = getattr(model, "hf_quantizer", None)
    qc = getattr(model.config, "quantization_config", None)
    if quantizer is not None:
        model.hf_quantizer = None
    if qc is not None:
        del model.config.quantization_config
    try:
        yield model
    finally:
        if quantizer is not None:
            model.hf_quantizer = quantizer
        if qc is not None:
            model.config.quantization_config = qc


def check_checkpoint_dir(out_dir: str) -> None:
    """--write-checkpoint must name a new or empty directory in a writable place (checked before loading)."""
    from ..files import check_writable

    if os.path.islink(out_dir):  # to a folder or dangling: the checkpoint would land wherever it points
        raise SensprofError(f"--write-checkpoint {out_dir!r} is a symbolic link; pass a new directory path")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        what = "is an existing file" if not os.path.isdir(out_dir) else "exists and is not an empty directory"
        raise SensprofError(f"--write-checkpoint {out_dir!r} {what}; pass a new directory path")
    check_writable(out_dir, "--write-checkpoint")


TMP_PREFIX = ".tmp-checkpoint-"  # + the checkpoint's name + "." + mkdtemp's 8 characters, beside the checkpoint


def remove_killed_exports(parent: str, name: str) -> None:
    """Delete the temporary folders earlier exports into `name` left when they were killed (kill -9 runs no
    cleanup). Called holding that checkpoint's lock, so none of them belongs to a running export."""
    import re

    own = re.compile(re.escape(TMP_PREFIX + name) + r"\.[a-z0-9_]{8}")
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        if own.fullmatch(entry) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def write_checkpoint(plan: Plan, model, tokenizer, out_dir: str, dtype=None, scales: bool | None = None) -> str:
    """Write out_dir atomically (a temporary sibling renamed into place); returns out_dir. Casts `model` to
    `dtype` (default bf16, what a GPU serves) in place (export ends there; pass a copy to keep it); `validate
    --engine` writes float32, the weights sensprof measured. `scales` (default: has_scales(plan)) adds the KV scales."""
    import torch

    from ..files import output_lock, write_error
    from ..reaper import fate_share

    dtype = dtype or torch.bfloat16
    check_checkpoint_dir(out_dir)
    parent = os.path.dirname(os.path.abspath(out_dir))
    name = os.path.basename(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    lock = os.path.join(parent, f".{name}.sensprof.lock")
    with output_lock(out_dir, "--write-checkpoint", lock):
        check_checkpoint_dir(out_dir)  # again, now that no other export can be writing it
        remove_killed_exports(parent, name)
        tmp = tempfile.mkdtemp(dir=parent, prefix=f"{TMP_PREFIX}{name}.")
        reaper = fate_share([], remove=tmp, lock=lock)  # a kill -9 of this export leaves no half-written checkpoint
        # and no lock file behind
        try:
            if model.dtype != dtype:
                model = model.to(dtype)
            with _plain_model(model):
                model.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            if has_scales(plan) if scales is None else scales:
                add_scales(plan, model, tmp)
            if os.path.exists(out_dir):
                os.rmdir(out_dir)
            os.replace(tmp, out_dir)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError):  # a full disk: nothing of the checkpoint is left behind
                raise write_error(out_dir, e) from None
            if type(e).__name__ == "SafetensorError":  # safetensors' own word for an I/O failure (a full disk)
                no_space = "space" in str(e).lower()
                raise write_error(out_dir, OSError(errno.ENOSPC if no_space else errno.EIO, str(e))) from None
            raise
        finally:
            reaper.release()
    return out_dir


def add_scales(plan: Plan, model, tmp: str) -> None:
    """Per-layer k_scale / v_scale (skipped layers have none), the kv_cache_scheme in config.json and the recipe."""
    import torch
    from safetensors.torch import save_file

    skipped = set(plan.engine.skip_layers or [])
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
        f.write(RECIPE.format(name=RECIPE_FILE, ignore_note=note, observer=OBSERVER))
