"""The plan artifact: which scheme each layer's K and V use, why, and what it is predicted to cost.

The runtime, exporters and validator accept only this. It carries the calibration each layer
needs (absmax per KV head), so it is self-contained.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import asdict, dataclass, field

from .errors import SensprofError
from .memory import MODEL_BITS, bits_held_per_element, bits_per_element, tokens_held
from .schemes import get_scheme
from .table import atomic_write_text, check_absmax, check_artifact, check_writable, read_json

PLAN_FORMAT_VERSION = 1
PLAN_KIND = "sensprof-plan"
FP8_E4M3_MAX = 448.0


@dataclass
class LayerPlan:
    layer: int
    kind: str
    window: int | None
    kv_heads: int
    head_dim: int
    k_scheme: str
    v_scheme: str
    k_damage: float
    v_damage: float
    absmax: dict = field(default_factory=dict)  # "K" / "K_pre" / "V" -> per-KV-head absmax


@dataclass
class Plan:
    model_id: str
    model_fingerprint: str
    target: str
    objective: str
    budget: dict
    layers: list[LayerPlan]
    engine: dict
    predicted: dict
    solver: dict
    profile: dict
    format_version: int = PLAN_FORMAT_VERSION
    kind: str = PLAN_KIND
    created: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict, path: str = "plan") -> Plan:
        check_artifact(obj, PLAN_KIND, PLAN_FORMAT_VERSION, path, "plan", "plan")
        try:
            data = dict(obj)
            data["layers"] = [LayerPlan(**layer) for layer in obj["layers"]]
            plan = cls(**data)
        except (TypeError, KeyError) as e:
            raise SensprofError(f"{path!r} is a malformed plan ({e}); re-run `sensprof plan`") from None
        plan.check(path)
        return plan

    def check(self, path: str = "plan") -> None:
        """Refuse a plan that contradicts itself: layers not 0..N-1, impossible shapes, unknown schemes, NaN or
        negative calibration, or a layer list of another size than its prediction was made for."""
        redo = "re-run `sensprof plan` (a hand-edited or damaged plan cannot be trusted)"
        if [p.layer for p in self.layers] != list(range(len(self.layers))) or not self.layers:
            raise SensprofError(f"plan {path!r} lists layers {[p.layer for p in self.layers][:8]}, not layers 0-N in "
                                f"order; {redo}")
        for p in self.layers:
            if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (p.kv_heads, p.head_dim)):
                raise SensprofError(f"plan {path!r} layer {p.layer} has {p.kv_heads!r} KV heads of dimension "
                                    f"{p.head_dim!r}, not positive integers; {redo}")
            get_scheme(p.k_scheme), get_scheme(p.v_scheme)  # an unknown name lists the valid ones
            check_absmax(p.absmax, f"plan {path!r} (layer {p.layer})",
                         "re-profile into a new --out and re-plan (calibration with NaN or negative absmax makes "
                         "NaN scales)")
        want = (self.predicted or {}).get("bf16_bytes_per_token")
        have = sum(2 * p.kv_heads * p.head_dim for p in self.layers) * MODEL_BITS / 8
        if isinstance(want, (int, float)) and abs(want - have) > 1e-9 * max(have, 1.0):
            raise SensprofError(f"plan {path!r} lists {len(self.layers)} layers holding {have:,.0f} bf16 bytes per "
                                f"token, but it was planned for {want:,.0f}; its layer list was edited: {redo}")

    def check_layers(self, shapes: list[tuple[int, int]], model: str) -> None:
        """Refuse a plan whose layers are not the model's: `shapes` is (kv_heads, head_dim) per layer, or a
        layer count alone as [None] * n."""
        if len(shapes) != len(self.layers):
            raise SensprofError(f"the plan has {len(self.layers)} layers but {model} has {len(shapes)}; pass the "
                                "model it was planned for with --model, or re-plan from a profile of this model")
        for p, shape in zip(self.layers, shapes):
            if shape is not None and tuple(shape) != (p.kv_heads, p.head_dim):
                raise SensprofError(
                    f"the plan's layer {p.layer} has {p.kv_heads} KV heads x {p.head_dim} but {model}'s has "
                    f"{shape[0]} x {shape[1]}; pass the model it was planned for with --model, or re-plan")

    def save(self, path: str) -> None:
        import json

        try:
            text = json.dumps(self.to_json(), indent=1, allow_nan=False)
        except ValueError:
            raise SensprofError(f"the plan for {path!r} holds a NaN or infinite number (budget {self.budget}); "
                                "check the profile (`sensprof summary`) and the budget, then re-plan") from None
        check_writable(path, "--out", "file")
        atomic_write_text(path, text + "\n")

    def engine_summary(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.engine.items() if k != "needs_scales") or "per-layer schemes"

    def fp8_scale(self, layer: int, tensor: str) -> float:
        """Per-tensor e4m3 scale (absmax / 448) an engine needs for this layer's K or V."""
        a = self.layers[layer].absmax.get(tensor) or [0.0]
        return max(max(a) / FP8_E4M3_MAX, 1e-12)


def load_plan(path: str) -> Plan:
    if not os.path.isfile(path):
        raise SensprofError(f"plan file {path!r} does not exist; write one with `sensprof plan PROFILE_DIR`")
    return Plan.from_json(read_json(path, "plan"), path)


def predicted_summary(layers: list[LayerPlan]) -> dict:
    """Long-context storage of the plan: bits per element and bytes per token, vs the 16-bit cache."""
    bits = sum((bits_per_element(get_scheme(p.k_scheme), p.head_dim)
                + bits_per_element(get_scheme(p.v_scheme), p.head_dim)) * p.kv_heads * p.head_dim for p in layers)
    elems = sum(2 * p.kv_heads * p.head_dim for p in layers)
    return {"avg_bits": bits / elems, "bytes_per_token": bits / 8, "bf16_bytes_per_token": elems * MODEL_BITS / 8,
            "fraction_of_bf16": bits / (elems * MODEL_BITS)}


def held_avg_bits(layers, n_tokens: int) -> float:
    """Average bits per element the plan's cache holds after n_tokens (memory.bits_held_per_element); a
    sliding-window layer holds its window, as Budget(context_len=...) prices it."""
    held = 0.0
    for p in layers:
        n = tokens_held(n_tokens, getattr(p, "kind", None), getattr(p, "window", None))
        held += sum(bits_held_per_element(get_scheme(s), n, p.kv_heads, p.head_dim) for s in (p.k_scheme, p.v_scheme)) \
            * p.kv_heads * p.head_dim
    return held / sum(2 * p.kv_heads * p.head_dim for p in layers)


def build_plan(profile, solution, target: str, objective: str, budget) -> Plan:
    meta = profile.meta
    layers = []
    for info, (k, v) in zip(meta["layers"], solution.choices):
        i = info["index"]
        layers.append(LayerPlan(
            layer=i, kind=info["kind"], window=info["window"], kv_heads=info["kv_heads"], head_dim=info["head_dim"],
            k_scheme=k, v_scheme=v, k_damage=0.0 if k == "none" else _damage(profile, i, "K", k, objective),
            v_damage=0.0 if v == "none" else _damage(profile, i, "V", v, objective),
            absmax=profile.calibration.get(str(i), {})))
    predicted = {"damage": solution.damage, "objective": objective, "budget_used": solution.cost,
                 "budget_limit": solution.limit, **predicted_summary(layers)}
    n = getattr(budget, "context_len", None)
    if n:  # what a cache of that length holds, full-precision tokens included (the budget priced this)
        predicted["context_len"] = n
        predicted["avg_bits_at_context"] = held_avg_bits(layers, n)
    return Plan(
        model_id=meta["model"]["id"], model_fingerprint=meta["model"]["fingerprint"], target=target,
        objective=objective, budget=budget.to_json(), layers=layers, engine=solution.engine, predicted=predicted,
        solver={"name": "PuLP CBC", "status": solution.status, "time_s": solution.solve_time_s},
        profile={"path": os.path.abspath(profile.path) if profile.path else None,
                 "settings": meta["settings"], "window_slots": meta.get("window_slots"),
                 "text_files": meta.get("text_files"), "text": meta.get("text")},
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def _damage(profile, layer, tensor, scheme, objective) -> float:
    from .planner import OBJECTIVES

    t = profile.table
    row = t[(t.layer == layer) & (t.tensor == tensor) & (t.scheme == scheme)]
    return float(row[OBJECTIVES[objective]].iloc[0])
