"""The quantized KV-cache runtime: executes a plan's per-layer K and V schemes for real."""

from .cache import PlannedCache, PlannedLayer

__all__ = ["PlannedCache", "PlannedLayer"]
