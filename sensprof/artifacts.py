"""The plan artifact as typed, frozen records, and its JSON form (format version 2; version 1 is read).

Every module that reads a plan reads these fields, never a dict whose keys depend on the target. The
profile a plan came from is stored relative to the plan file (and by fingerprint), so a plan committed or
copied to another machine still finds its profile beside it, or says it cannot. Imports no torch.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from dataclasses import dataclass, field

from .planning.budget import Budget
from .constants import FP8_E4M3_MAX
from .errors import SensprofError
from .files import atomic_write_text, check_artifact, check_writable, read_json, safe_name
from .memory import MODEL_BITS, bits_per_element
from .schemes import get_scheme

PLAN_FORMAT_VERSION = 2
PLAN_KIND = "sensprof-plan"
READABLE_VERSIONS = (1, 2)
HAND_MADE = "hand-made"  # the solver status of a plan written by hand (Plan.hand_made): its budget is nominal


@dataclass(frozen=True)
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


# ---------------------------------------------------------------- what each target's engine is told


@dataclass(frozen=True)
class EngineSettings:
    """The sensprof runtime: per-layer schemes, no engine flags."""

    needs_scales: bool = False

    def flags(self) -> dict:
        """The settings a person reads in a summary line."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "needs_scales"}


@dataclass(frozen=True)
class VllmSettings(EngineSettings):
    kv_cache_dtype: str = "auto"
    k_scheme: str = "none"
    v_scheme: str = "none"
    skip_layers: tuple[int, ...] = ()
    forced_skip_layers: tuple[int, ...] = ()  # boundary layers vLLM itself keeps at the model dtype
    vllm_gpu: str | None = None
    # a per-layer plan (plan --per-layer), served by sensprof's vLLM plugin (plugins/vllm): each layer's dtype, and
    # the model class the plugin checks the served model against; empty: one dtype plus skipped layers
    layer_dtypes: tuple[str, ...] = ()
    architecture: str | None = None


@dataclass(frozen=True)
class SglangSettings(EngineSettings):
    kv_cache_dtype: str = "auto"
    k_scheme: str = "none"
    v_scheme: str = "none"


@dataclass(frozen=True)
class LlamacppSettings(EngineSettings):
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    channel_order: str = "halves"  # the GGUF's key channel order the plan was priced in (engines/llamacpp/catalog.py)


ENGINE_SETTINGS: dict[str, type[EngineSettings]] = {
    "sensprof": EngineSettings, "vllm": VllmSettings, "sglang": SglangSettings, "llamacpp": LlamacppSettings}


def engine_settings(target: str, values: dict) -> EngineSettings:
    """The target's settings record from a planner's (or a version-1 plan's) dict."""
    cls = ENGINE_SETTINGS.get(target)
    if cls is None:
        raise SensprofError(f"unknown target {target!r}; choose one of {', '.join(ENGINE_SETTINGS)}")
    if "scheme" in values and "k_scheme" not in values:  # the first plans stored one scheme for K and V
        values = {k: v for k, v in values.items() if k != "scheme"} | {"k_scheme": values["scheme"],
                                                                       "v_scheme": values["scheme"]}
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise SensprofError(f"the {target} settings hold unknown fields {unknown}; re-run `sensprof plan`")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


# ---------------------------------------------------------------- predictions, solver record, profile reference


@dataclass(frozen=True)
class Predicted:
    """What the profile predicts for the plan: summed damage and the storage it costs."""

    damage: float
    objective: str
    avg_bits: float
    bytes_per_token: float
    bf16_bytes_per_token: float
    fraction_of_bf16: float
    budget_used: float | None = None  # in the budget's unit; None for a plan not made by the solver
    budget_limit: float | None = None
    context_len: int | None = None  # with Budget(context_len): the bits a cache of that length holds
    avg_bits_at_context: float | None = None
    vllm_pool_bytes: int | None = None  # vllm serving budgets: what vLLM's pool needs, alignment included
    # sensprof.pricing: the read regime and serving length the damage was priced for, and the scale per scheme
    pricing: dict | None = None
    # plan --select-measured: the plan's KL with every layer quantized at once over its per-layer sum (priced at that
    # length), measured on the selection's windows (never validate's), per length in tokens ({"256": f, "1024": g}):
    # the layers' interaction that the sum misses, which validate's prediction for the plan carries
    joint_factor: dict | None = None

    def joint_factor_at(self, n: int) -> float | None:
        """The joint factor for a window of n tokens: measured at n, else at the nearest measured length (in log)."""
        if not self.joint_factor:
            return None
        lengths = {int(k): float(v) for k, v in self.joint_factor.items()}
        return lengths[min(lengths, key=lambda m: (abs(math.log(m / n)), -m))]

    def joint_summary(self) -> str:
        """The joint factors as a person reads them: '1.22x (256 tokens), 1.70x (1024 tokens)'."""
        return ", ".join(f"{float(f):.2f}x ({n} tokens)"
                         for n, f in sorted((self.joint_factor or {}).items(), key=lambda x: int(x[0])))


def serving_line(plan, n: int | None = None, per_layer_sum: float | None = None) -> str | None:
    """What the engine is predicted to measure at n tokens (default the plan's serving length), with the band
    measured for such predictions (sensprof.planning.prediction); None for a plan optimised for another objective,
    or a streaming plan at another length without its sum priced there."""
    from .planning.prediction import for_plan

    p = for_plan(plan, n, per_layer_sum)
    return p.describe() if p else None


@dataclass(frozen=True)
class SolverRecord:
    name: str
    status: str
    time_s: float
    robust: float = 0.0  # --robust X: each cell cost its mean KL plus X times its spread
    refine: tuple[dict, ...] = ()  # --refine: every round's measured and predicted KL
    select: dict | None = None  # --select-measured: the candidates, their measured KL, the choice (sensprof.selection)


@dataclass(frozen=True)
class ProfileRef:
    """Where the plan's numbers came from. `path` is as the program sees it (absolute or from the working
    directory); in the file it is relative to the plan's folder."""

    path: str | None
    settings: dict
    fingerprint: str = ""  # the profiled model's
    window_slots: tuple[int, ...] | None = None
    text_files: tuple[str, ...] | None = None
    text: str | None = None
    plan_dir: str | None = field(default=None, compare=False)  # the folder of the plan file read (never from it)

    def text_roots(self) -> list[str] | None:
        """Where its text files may be read (files.check_recorded_files): the plan file's folder and the current
        folder for a plan read from a file, the profile's folder and the current folder for one made here."""
        root = self.plan_dir or self.path
        return [root, "."] if root else None

    def locate(self) -> str | None:
        """The profile directory if it is there, else None."""
        return self.path if self.path and os.path.isdir(self.path) else None

    def missing_note(self) -> str:
        return (f"the plan's profile ({self.path or 'no path recorded'}) is not there, so its predictions are left "
                "out; keep the profile beside the plan, or re-plan")


def uniform_verdict(lead: dict | None) -> str:
    """How a uniform configuration the selection chose stands against the plans (`solver.select.lead`: the best
    plan's lead over it, recorded where a plan measured lower)."""
    return ("within one standard error of the best plan" if lead is not None and not lead["beyond_noise"]
            else "lower KL than every plan")


@dataclass(frozen=True)
class Plan:
    model_id: str
    model_fingerprint: str
    target: str
    objective: str
    budget: Budget
    layers: tuple[LayerPlan, ...]
    engine: EngineSettings
    predicted: Predicted
    solver: SolverRecord
    profile: ProfileRef
    created: str = ""
    format_version: int = PLAN_FORMAT_VERSION
    kind: str = PLAN_KIND

    def __post_init__(self):
        """Records built from their JSON dicts where a caller passes dicts (the planner, tests, old code)."""
        coerce = {
            "layers": lambda v: tuple(_layer(x) for x in v),
            "budget": lambda v: Budget.from_json(v) if isinstance(v, dict) else v,
            "engine": lambda v: engine_settings(self.target, v) if isinstance(v, dict) else v,
            "predicted": lambda v: Predicted(**v) if isinstance(v, dict) else v,
            "solver": lambda v: solver_record(v) if isinstance(v, dict) else v,
            "profile": lambda v: profile_ref(v, self.model_fingerprint) if isinstance(v, dict) else v,
        }
        for name, fn in coerce.items():
            object.__setattr__(self, name, fn(getattr(self, name)))

    @classmethod
    def hand_made(cls, model_id: str, fingerprint: str, layers, target: str = "sensprof") -> Plan:
        """A plan written by hand (tests, a notebook): the given layers, nothing predicted, no profile behind it."""
        layers = tuple(_layer(x) for x in layers)
        return cls(model_id=model_id, model_fingerprint=fingerprint, target=target, objective="kl",
                   budget=Budget("avg_bits", 16.0), layers=layers, engine=ENGINE_SETTINGS[target](),
                   predicted=Predicted(damage=0.0, objective="kl", **predicted_summary(layers)),
                   solver=SolverRecord(name="none", status=HAND_MADE, time_s=0.0),
                   profile=ProfileRef(path=None, settings={}, fingerprint=fingerprint), created=now())

    def replace(self, **changes) -> Plan:
        return dataclasses.replace(self, **changes)

    def check(self, path: str = "plan") -> None:
        """Refuse a plan that contradicts itself: layers not 0..N-1, impossible shapes, unknown schemes, NaN or
        negative calibration, or a layer list of another size than its prediction was made for."""
        from .profiling.table import check_absmax

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
        self._check_fields(path, redo)
        want = self.predicted.bf16_bytes_per_token
        have = sum(2 * p.kv_heads * p.head_dim for p in self.layers) * MODEL_BITS / 8
        if isinstance(want, (int, float)) and abs(want - have) > 1e-9 * max(have, 1.0):
            raise SensprofError(f"plan {path!r} lists {len(self.layers)} layers holding {have:,.0f} bf16 bytes per "
                                f"token, but it was planned for {want:,.0f}; its layer list was edited: {redo}")

    @property
    def layer_dtypes(self) -> tuple[str, ...]:
        """A per-layer vLLM plan's dtype for each layer (served by sensprof's plugin); empty for any other plan."""
        return tuple(getattr(self.engine, "layer_dtypes", ()) or ())

    def _check_fields(self, path: str, redo: str) -> None:
        """Every field a command prints or acts on, of its type and in its range (a hand-edited plan once exported
        --kv-cache-dtype-skip-layers 999 for a 3-layer model and printed a NaN prediction)."""
        def number(x) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        p = self.predicted
        if not number(p.damage) or (p.objective == "kl" and p.damage < 0):
            raise SensprofError(f"plan {path!r} predicts {p.objective} {p.damage!r}, not a finite"
                                f"{' non-negative' if p.objective == 'kl' else ''} number; {redo}")
        if p.joint_factor is not None:
            items = p.joint_factor.items() if isinstance(p.joint_factor, dict) else [(None, None)]
            for n, f in items:
                if not (isinstance(n, str) and n.isdigit() and int(n) > 0 and number(f) and 0 <= f < 1e6):
                    raise SensprofError(f"plan {path!r} holds a joint factor {f!r} at {n!r} tokens, not a non-negative "
                                        f"factor per length; {redo}")
        n = len(self.layers)
        for kept in ("skip_layers", "forced_skip_layers"):
            layers = getattr(self.engine, kept, ())
            if not isinstance(layers, tuple) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n
                                                        for i in layers) or len(set(layers)) != len(layers):
                raise SensprofError(f"plan {path!r} lists engine {kept} {list(layers) if isinstance(layers, tuple) else layers!r}, "
                                    f"not distinct layers of its {n}; {redo}")
        dtypes = getattr(self.engine, "layer_dtypes", ())  # as loaded, not yet known to be a tuple
        if dtypes:
            from .targets import PER_LAYER_DTYPES, per_layer_flags

            allowed = set(per_layer_flags(self.engine.vllm_gpu))
            if (not isinstance(dtypes, tuple) or len(dtypes) != n or any(d not in allowed for d in dtypes)
                    or not isinstance(self.engine.architecture, str)):
                raise SensprofError(f"plan {path!r} lists per-layer vLLM dtypes that are not one of "
                                    f"{', '.join(PER_LAYER_DTYPES.get(self.engine.vllm_gpu, ())) or 'none'} (or a "
                                    f"k:<K>/v:<V> pair of the plugin's) for each of its {n} layers (with the model's "
                                    f"architecture); {redo}")
        select = self.solver.select
        if select is not None:
            want = {"chosen": str, "uniform_won": bool, "windows": int, "seq_len": int, "candidates": list}
            if not isinstance(select, dict) or any(not isinstance(select.get(k), t) for k, t in want.items()):
                raise SensprofError(f"plan {path!r} holds a selection record that is not one `plan --select-measured` "
                                    f"writes; {redo}")

    def check_model(self, fingerprint: str, model: str,
                    fix: str = "pass the profiled model with --model or re-plan") -> None:
        """The one fingerprint check: refuse running, measuring or drawing a plan with a model (or a profile of
        one) it was not planned for."""
        if fingerprint != self.model_fingerprint:
            raise SensprofError(
                f"the plan was made for model fingerprint {self.model_fingerprint} ({self.model_id}), but {model} "
                f"has fingerprint {fingerprint}; {fix}")

    def check_layers(self, shapes: list, model: str) -> None:
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

    def default_path(self) -> str:
        """plans/<model>-<target>[-per-layer]-<budget>.json"""
        kind = self.target + ("-per-layer" if self.layer_dtypes else "")
        return os.path.join("plans", f"{safe_name(self.model_id)}-{kind}-{self.budget.tag()}.json")

    def describe(self) -> str:
        """The plan as a person reads it: storage, prediction, engine settings, one line per layer."""
        p = self.predicted
        held = ""
        if p.context_len:
            held = f"; {p.avg_bits_at_context:.2f} held at {p.context_len} tokens"
        elif any(layer.kind == "sliding" for layer in self.layers):
            held = "; per token slot: sliding-window layers hold less, --context-len N prices what N tokens hold"
        lines = [f"plan for {self.model_id} -> target {self.target}: {p.avg_bits:.2f} bits/element "
                 f"({p.fraction_of_bf16:.3f} of bf16, {p.bytes_per_token:,.0f} bytes/token{held}"
                 + f"), predicted {p.objective} {p.damage:.3e}; solver {self.solver.status} in "
                   f"{self.solver.time_s:.2f} s"]
        serving = serving_line(self)
        if serving:
            lines.append(serving)
        outgrown = self.outgrown_windows()
        if outgrown:
            lines.append(f"note: {outgrown}")
        chosen = self.solver.select
        if chosen:
            won = (f"the uniform configuration {chosen['chosen'].removeprefix('uniform ')} measured "
                   f"{uniform_verdict(chosen.get('lead'))}, so the plan is that configuration" if chosen["uniform_won"]
                   else f"{chosen['chosen']} won")
            lines.append(f"chosen by measured KL on {chosen['windows']} x {chosen['seq_len']} unseen tokens"
                         + (f" of {chosen['text']}" if chosen.get("text") else "") + " among "
                         f"{len(chosen['candidates'])} candidates: {won}"
                         + (f"; all layers at once measured {p.joint_summary()} the per-layer sum there"
                            if p.joint_factor else ""))
        if self.target != "sensprof":
            flags = self.engine.flags() | {"needs_scales": self.engine.needs_scales}
            lines.append("engine: " + ", ".join(f"{k}={v}" for k, v in flags.items()))
        w = max([20, *(len(layer.k_scheme) for layer in self.layers)])  # llama.cpp's key names run longer
        lines.append(f"layer kind     {'K scheme':<{w}} V scheme")
        for layer in self.layers:
            lines.append(f"{layer.layer:>5} {layer.kind:<8} {layer.k_scheme:<{w}} {layer.v_scheme}")
        return "\n".join(lines)

    def outgrown_windows(self) -> str | None:
        """The note for a plan served past a sliding window its profile never passed (pricing.outgrown_windows_note)."""
        from .planning.prediction import serving_len
        from .planning.pricing import outgrown_windows_note

        profile_len = (self.predicted.pricing or {}).get("profile_len") or self.profile.settings.get("seq_len")
        if not profile_len:
            return None
        layers = [{"index": l.layer, "kind": l.kind, "window": l.window} for l in self.layers]
        return outgrown_windows_note(layers, int(profile_len), serving_len(self), self.target)

    def engine_summary(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.engine.flags().items()) or "per-layer schemes"

    def fp8_scale(self, layer: int, tensor: str) -> float:
        """Per-tensor e4m3 scale (absmax / 448) an engine needs for this layer's K or V."""
        a = self.layers[layer].absmax.get(tensor) or [0.0]
        return max(max(a) / FP8_E4M3_MAX, 1e-12)

    # ------------------------------------------------------------ JSON

    def to_json(self, plan_dir: str | None = None) -> dict:
        """The file form; `plan_dir` (the folder the plan is written to) makes the profile path relative."""
        out = dataclasses.asdict(self)
        out["budget"] = self.budget.to_json()
        out["engine"] = self.engine.flags() | {"needs_scales": self.engine.needs_scales}
        path = self.profile.path
        if path and plan_dir is not None:
            path = os.path.relpath(os.path.abspath(path), os.path.abspath(plan_dir))
        out["profile"]["path"] = path
        del out["profile"]["plan_dir"]
        return _json_native(out)

    @classmethod
    def from_json(cls, obj: dict, path: str = "plan") -> Plan:
        """A plan file's contents; `path` (the file) resolves the relative profile path and names the file in
        errors. Version-1 plans (absolute profile paths, no fingerprint of the profile) are read as well."""
        check_artifact(obj, PLAN_KIND, obj.get("format_version") if isinstance(obj, dict) else None, path, "plan",
                       "plan")
        version = obj.get("format_version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise SensprofError(f"{path!r} holds a plan format version {version!r}; this sensprof reads versions "
                                f"{' and '.join(map(str, READABLE_VERSIONS))}: re-run `sensprof plan`")
        obj = {**obj, "format_version": PLAN_FORMAT_VERSION}
        try:
            prof = dict(obj["profile"])
            ppath = prof.get("path")
            if ppath and not os.path.isabs(ppath):
                ppath = os.path.normpath(os.path.join(os.path.dirname(path), ppath))
            plan = cls(**obj | {"profile": {**prof, "path": ppath}})
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise SensprofError(f"{path!r} is a malformed plan ({e}); re-run `sensprof plan`") from None
        object.__setattr__(plan.profile, "plan_dir", os.path.dirname(path) or ".")
        plan.check(path)
        return plan

    def save(self, path: str) -> None:
        try:
            text = json.dumps(self.to_json(os.path.dirname(path) or "."), indent=1, allow_nan=False)
        except ValueError:
            raise SensprofError(f"the plan for {path!r} holds a NaN or infinite number (budget {self.budget}); "
                                "check the profile (`sensprof summary`) and the budget, then re-plan") from None
        check_writable(path, "--out", "file")
        atomic_write_text(path, text + "\n")


def _json_native(x):
    """Tuples as lists, as the file holds them (so to_json() == json.loads(the file))."""
    if isinstance(x, dict):
        return {k: _json_native(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_native(v) for v in x]
    return x


def _layer(x) -> LayerPlan:
    if isinstance(x, LayerPlan):
        return x
    if not isinstance(x, dict):
        raise TypeError(f"a layer is {type(x).__name__}, not an object")
    return LayerPlan(**x)


def _tuple(x):
    return tuple(x) if isinstance(x, (list, tuple)) else x


def solver_record(obj: dict) -> SolverRecord:
    return SolverRecord(name=obj["name"], status=obj["status"], time_s=float(obj["time_s"]),
                        robust=float(obj.get("robust", 0.0)), refine=tuple(obj.get("refine", ())),
                        select=obj.get("select"))


def profile_ref(obj: dict, fingerprint: str) -> ProfileRef:
    return ProfileRef(path=obj.get("path"), settings=dict(obj["settings"]),
                      fingerprint=obj.get("fingerprint") or fingerprint, window_slots=_tuple(obj.get("window_slots")),
                      text_files=_tuple(obj.get("text_files")), text=obj.get("text"))


def predicted_summary(layers: list[LayerPlan]) -> dict:
    """Long-context storage of the plan: bits per element and bytes per token, vs the 16-bit cache."""
    bits = sum((bits_per_element(get_scheme(p.k_scheme), p.head_dim)
                + bits_per_element(get_scheme(p.v_scheme), p.head_dim)) * p.kv_heads * p.head_dim for p in layers)
    elems = sum(2 * p.kv_heads * p.head_dim for p in layers)
    return {"avg_bits": bits / elems, "bytes_per_token": bits / 8, "bf16_bytes_per_token": elems * MODEL_BITS / 8,
            "fraction_of_bf16": bits / (elems * MODEL_BITS)}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load_plan(path: str) -> Plan:
    if os.path.isdir(path):
        raise SensprofError(f"plan {path!r} is a folder, not a plan file; pass the JSON file `sensprof plan` wrote")
    if not os.path.isfile(path):
        raise SensprofError(f"plan file {path!r} does not exist; write one with `sensprof plan PROFILE_DIR`")
    return Plan.from_json(read_json(path, "plan", f"{path!r} is not a sensprof plan (it is empty, corrupt or "
                                    "not JSON text); pass the JSON file `sensprof plan` wrote, or write one with it"), path)
