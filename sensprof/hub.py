"""Which Hugging Face repository a model came from: a GGUF file's provenance, for engines that load hub weights."""

from __future__ import annotations

import os
import re

from .models import BUILTIN_MODELS, gguf_metadata, resolve_model

# GGUF metadata keys naming the Hugging Face repository a file was converted from (gguf-py constants.py; the
# first is the older spelling). general.base_model.* names the *parent* model (e.g. before fine-tuning),
# whose weights differ, so it is only offered as a hint, never served.
GGUF_SOURCE_KEYS = ("general.source.huggingface.repository", "general.source.repo_url", "general.source.url")
_HF_URL = re.compile(r"^https?://(?:www\.)?huggingface\.co/([A-Za-z0-9][\w.-]*/[\w.-]+?)(?:\.git)?/?$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_id_from(value: str) -> str | None:
    """'org/name' from a hub id or a huggingface.co URL; None for anything else."""
    value = str(value).strip()
    m = _HF_URL.match(value)
    if m:
        return m.group(1)
    return value if _HUB_ID.match(value) and "://" not in value else None


def gguf_source_hub_id(meta: dict) -> str | None:
    for key in GGUF_SOURCE_KEYS:
        if key in meta and hub_id_from(meta[key]):
            return hub_id_from(meta[key])
    return None


def gguf_base_models(meta: dict) -> list[str]:
    """Hub ids of the parent models general.base_model.N.* names (repo_url, else organization/name)."""
    out = []
    for i in range(int(meta.get("general.base_model.count", 0) or 0)):
        rid = hub_id_from(meta.get(f"general.base_model.{i}.repo_url", ""))
        org, name = meta.get(f"general.base_model.{i}.organization"), meta.get(f"general.base_model.{i}.name")
        rid = rid or (hub_id_from(f"{org}/{name}") if org and name else None)
        if rid:
            out.append(rid)
    return out


def served_hub_id(name: str) -> tuple[str | None, list[str]]:
    """For a GGUF model (alias or file): the hub repository it was converted from, or None plus the parent
    models its metadata names. (None, []) for models that are not GGUF."""
    src = resolve_model(name)
    if not src["gguf_file"]:
        return None, []
    if src["kind"] == "builtin" and BUILTIN_MODELS[name].get("hub_id"):
        return BUILTIN_MODELS[name]["hub_id"], []
    meta = gguf_metadata(os.path.join(src["path"], src["gguf_file"]))
    return gguf_source_hub_id(meta), gguf_base_models(meta)
