"""sensprof's vLLM plugin: serve a per-layer KV-cache dtype plan given in --additional-config '{"sensprof_plan": ...}'.

vLLM calls register() (entry point group vllm.general_plugins) in every process, possibly more than once; it is
idempotent. It wraps Attention.__init__ with a pass-through that acts only when the current vLLM config carries a
plan (see patch.py); without one, every layer is built exactly as vLLM builds it. See docs/vllm-plugin.md."""

from __future__ import annotations

from .plan import FORMAT, KEY, VERSION, Plan, PlanError, parse_plan  # noqa: F401

__all__ = ["register", "parse_plan", "Plan", "PlanError", "KEY", "FORMAT", "VERSION"]


def register() -> None:
    from .patch import install

    install()
