"""The per-layer K/V sensitivity profiler.

One baseline pass records every decoder layer's output, calibration absmax and cache statistics.
Then each cell (layer, tensor, scheme) quantizes only that tensor of that layer and replays the
model from that layer on (the layers before it would compute the baseline again).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field

import torch

from .. import __version__
from ..constants import GIB, KL_SAMPLED_TOKENS
from ..errors import SensprofError
from ..files import write_json
from .hooks import attention_taps, record_layer_outputs, replay_from
from ..memory import bits_per_element
from ..models import describe_layers, fingerprint, layer_infos_to_json
from .outputs import Baseline, MaterializedBaseline, output_head
from ..schemes import Menu, QuantScheme, scheme_revision
from .table import (
    CALIBRATION,
    FORMAT_VERSION,
    KIND,
    META,
    PARTS,
    STATS,
    STATS_COLUMNS,
    Profile,
    check_out_dir,
    load_parts,
    load_profile,
    part_path,
    write_csv,
    write_tables,
)
from .screen import fill_rows, to_measure
from .suffix import PrefixRecorder, replay_suffix, stop_after
from .taps import QuantTap, StatsTap, check_reads, first_quantized_row


def parse_kl(kl: str) -> int:
    """--kl exact | materialized | sampled[:K] -> tokens sampled per position (0: exact)."""
    if kl in ("exact", "materialized"):
        return 0
    if kl == "sampled" or kl.startswith("sampled:"):
        k = kl.partition(":")[2] or str(KL_SAMPLED_TOKENS)
        if k.isdigit() and int(k) >= 1:
            return int(k)
    raise SensprofError(f"--kl {kl!r} is not exact, materialized or sampled[:K] (e.g. sampled:256)")


def check_modes(kl: str, screen: bool, replay: bool = True, naive: bool = False) -> int:
    """Refuse option combinations that cannot run (before any model loads); tokens sampled per position (0:
    exact). `naive`: the CLI's --naive, which picks the KL itself."""
    sample = parse_kl(kl)
    if naive and kl != "exact":
        raise SensprofError("--naive compares full logits; drop --kl")
    if screen and (not replay or kl == "materialized"):
        raise SensprofError("--screen predicts cells from the replay's local metrics; drop --naive or --kl materialized")
    return sample


def _input_device(model):
    return model.get_input_embeddings().weight.device


def _versions() -> dict:
    import transformers

    return {"sensprof": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def profile_settings(model, input_ids: torch.Tensor, menu: Menu, *, text_digest: str, seed: int,
                     variants_per_pass: int, kl: str = "exact", screen: bool = False, reads: str = "streaming") -> dict:
    """What must match for two runs to belong to one profile (--layers excluded)."""
    p = next(model.parameters())
    return {"model_fingerprint": fingerprint(model), "seq_len": int(input_ids.shape[1]),
            "windows": int(input_ids.shape[0]), "seed": seed, "text_digest": text_digest,
            "k_schemes": [s.name for s in menu.k], "v_schemes": [s.name for s in menu.v],
            "dtype": str(p.dtype).replace("torch.", ""), "device_type": p.device.type,
            "variants_per_pass": variants_per_pass, "kl": kl, **({"screen": True} if screen else {}),
            **({"reads": reads} if reads != "streaming" else {})}  # a streaming profile resumes one written before --reads


def _baseline_pass(model, session, input_ids, n_layers, head, recorder=None):
    """One unquantized forward: statistics, every layer's output, and the final hidden states (or logits)."""
    stats_taps = [StatsTap(session, i, recorder) for i in range(n_layers)]
    for i, tap in enumerate(stats_taps):
        session.set_tap(i, tap)
    outputs: dict = {}
    try:
        with record_layer_outputs(model, outputs):
            final = model(input_ids=input_ids, use_cache=False).logits if head is None else head.hidden(input_ids)
    finally:
        session.clear_taps()
    return final, outputs, stats_taps


def kv_absmax(model, input_ids: torch.Tensor) -> list[dict]:
    """Per layer, each cached tensor's absmax per KV head on these windows: the calibration a profile records, for
    a check that calibrates on windows of its own (tests/engines, benchmarks/vllm_cpu_agreement.py)."""
    n = len(describe_layers(model))
    with torch.no_grad(), attention_taps(model) as session:
        _, _, taps = _baseline_pass(model, session, input_ids.to(_input_device(model)), n, None)
    return [{name: st.head_absmax.tolist() for name, st in tap.stats.items()} for tap in taps]


def _stats_rows(infos, stats_taps) -> tuple[list[dict], dict]:
    rows, calibration = [], {}
    for info, tap in zip(infos, stats_taps):
        calibration[str(info.index)] = {name: st.head_absmax.tolist() for name, st in tap.stats.items()}
        for name in ("K_pre", "K", "V"):
            st = tap.stats.get(name)
            if st is None:
                continue
            ratio = st.outlier_ratio()
            rows.append({"layer": info.index, "layer_kind": info.kind, "tensor": name,
                         "outlier_ratio": float(ratio.mean()), "outlier_ratio_max": float(ratio.max()),
                         "kurtosis": st.kurtosis(), "absmax": float(st.head_absmax.max())})
    return rows, calibration


def _cells_for_layer(menu: Menu, has_rope: bool):
    for tensor in ("K", "V"):
        yield tensor, [s for s in menu.for_tensor(tensor) if s.applies_to(tensor) and not s.is_identity
                       and (has_rope or not s.pre_rope)]


def _cell_forward(model, session, layer, ids, layer_outputs, repeat, head, baseline, recorder, start):
    """The quantized model's final hidden states (or logits, without `head`) for one pass of variants.

    With `start` > 0 the positions before it read nothing quantized: the layers after this one run over the
    positions start.. only (sensprof.suffix) and the baseline fills in the rest."""
    if head is None or recorder is None or start <= 0:
        with replay_from(model, layer, layer_outputs, repeat=repeat):
            return model(input_ids=ids, use_cache=False).logits if head is None else head.hidden(ids)
    with replay_from(model, layer, layer_outputs, repeat=repeat), stop_after(model, layer) as box:
        head.hidden(ids)
    session.clear_taps()
    suffix = replay_suffix(model, session, layer, start, ids, box["out"], recorder, head.hidden)
    return torch.cat([baseline.prefix(start).repeat(repeat, 1, 1).to(suffix.dtype), suffix], dim=1)


def profile_layer(model, session, layer, info, input_ids, baseline, layer_outputs, schemes_by_tensor,
                  calibration, variants_per_pass=1, replay=True, on_cell=None, head=None, seconds=None,
                  recorder=None, screen=False, reads="streaming") -> dict:
    """All cells of one layer: end-to-end and local damage for each (tensor, scheme).

    With `head` (an OutputHead) the forward stops at the final hidden states and `baseline` compares them in
    vocabulary chunks; without, the full logits are compared (--naive). With `recorder` (the baseline's first
    keys and values), the positions no quantized read reaches are not recomputed after this layer. With
    `screen`, only the cells sensprof.screen selects run end to end; the rest get a predicted KL."""
    rows, heads = [], []
    w = input_ids.shape[0]
    cal = {k: torch.tensor(v) for k, v in calibration.get(str(layer), {}).items()}
    reference: dict = {}  # the layer's unquantized attention, computed once for every cell's local metrics
    seconds = seconds if seconds is not None else {}

    def run(tensor, schemes, end_to_end, tick):
        """{scheme: (metrics or None, (attn_kl, out_rel_l2) per head)} for passes of variants_per_pass."""
        out_by_scheme = {}
        for start in range(0, len(schemes), variants_per_pass):
            chunk = schemes[start:start + variants_per_pass]
            pairs = [(s, None) if tensor == "K" else (None, s) for s in chunk]
            tap = QuantTap(session, layer, pairs, w, cal, reference=reference, reads=reads)
            session.set_tap(layer, tap)
            t0 = time.perf_counter()
            ids = input_ids.repeat(len(chunk), 1)
            try:
                if not end_to_end:  # the quantized layer alone: its local metrics
                    with replay_from(model, layer, layer_outputs, repeat=len(chunk)), stop_after(model, layer):
                        head.hidden(ids)
                    out = None
                elif replay:
                    first = 0 if recorder is None else min(recorder.length,
                                                           first_quantized_row(pairs, ids.shape[1], reads))
                    out = _cell_forward(model, session, layer, ids, layer_outputs, len(chunk), head, baseline,
                                        recorder, first)
                else:
                    out = model(input_ids=ids, use_cache=False).logits if head is None else head.hidden(ids)
            finally:
                session.clear_taps()
            key = "layers" if end_to_end else "screen"
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - t0
            for i, scheme in enumerate(chunk):
                m = baseline.compare(out[i * w:(i + 1) * w]) if out is not None else None
                out_by_scheme[scheme.name] = (m, tap.local[i])
                if tick and on_cell:
                    on_cell()
        return out_by_scheme

    for tensor, schemes in schemes_by_tensor:
        if screen:
            results = run(tensor, schemes, end_to_end=False, tick=False)
            local = {name: float(r[1][1].mean()) for name, r in results.items()}
            bits = {s.name: bits_per_element(s, info.head_dim) for s in schemes}
            kl: dict[str, float] = {}
            while names := to_measure(bits, local, kl):
                measured = run(tensor, [s for s in schemes if s.name in names], end_to_end=True, tick=False)
                results.update(measured)
                kl.update({name: r[0]["kl"] for name, r in measured.items()})
        else:
            results = run(tensor, schemes, end_to_end=True, tick=True)
        tensor_rows = []
        for scheme in schemes:
            m, (attn_kl, rel) = results[scheme.name]
            m = m or {"kl": float("nan"), "kl_std": float("nan"), "dnll": float("nan")}
            tensor_rows.append({"layer": layer, "layer_kind": info.kind, "tensor": tensor, "scheme": scheme.name,
                                "bits": bits_per_element(scheme, info.head_dim), "kl": m["kl"],
                                "kl_std": m["kl_std"], "dnll": m["dnll"], "attn_kl": float(attn_kl.mean()),
                                "out_rel_l2": float(rel.mean()), "measured": results[scheme.name][0] is not None,
                                **({"kl_windows": m["kl_per_window"]} if "kl_per_window" in m else {})})
            for h in range(attn_kl.shape[0]):
                heads.append({"layer": layer, "tensor": tensor, "scheme": scheme.name, "head": h,
                              "attn_kl": float(attn_kl[h]), "out_rel_l2": float(rel[h])})
            if screen and on_cell:
                on_cell()
        if screen:
            fill_rows(tensor_rows)
        rows += tensor_rows
    return {"layer": layer, "rows": rows, "heads": heads}


SUFFIX_REPLAY = True  # replay only the positions a cell can move (sensprof.suffix); False: every position


def _prefix_recorder(menu: Menu, layers, n: int, reads: str = "streaming") -> PrefixRecorder | None:
    """What the baseline pass keeps for suffix replays: as many first positions as any cell leaves unmoved."""
    if not SUFFIX_REPLAY or not layers:
        return None
    starts = [first_quantized_row([(s, None)], n, reads) for s in menu.schemes]
    longest = max([s for s in starts if s < n], default=0)
    return PrefixRecorder(longest) if longest > 0 else None


def peak_memory() -> dict:
    """Peak resident memory of this process (and of CUDA allocations), GiB."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"peak_rss_gib": rss / (GIB if sys.platform == "darwin" else 2**20)}  # ru_maxrss: bytes on macOS, KiB elsewhere
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_cuda_gib"] = torch.cuda.max_memory_allocated() / GIB
    return out


@dataclass
class Cells:
    """What every cell of one run reads: the baseline pass's layer outputs and final states, the calibration,
    the run's options. A local run builds one; a Ray worker keeps one between the shards it is sent."""

    model: object
    session: object
    input_ids: torch.Tensor
    menu: Menu
    infos: list
    head: object
    recorder: object
    baseline: object
    layer_outputs: dict
    calibration: dict
    stats_rows: list
    has_rope: dict
    variants_per_pass: int = 1
    replay: bool = True
    screen: bool = False
    reads: str = "streaming"  # how the profiled cache is read (taps.READS)
    seconds: dict = field(default_factory=dict)

    def shards(self, layer: int) -> list:
        """(tensor, schemes) of one layer, K first: the order of a part's rows."""
        return list(_cells_for_layer(self.menu, self.has_rope[layer]))

    def cost_s(self) -> dict:
        return {**{k: round(v, 3) for k, v in self.seconds.items()},
                **{k: round(v, 3) for k, v in self.baseline.seconds.items()}}


def baseline_cells(model, session, input_ids, menu: Menu, layers, *, kl="exact", seed=0, variants_per_pass=1,
                   replay=True, screen=False, reads="streaming") -> Cells:
    """The unquantized pass whose outputs every cell of `layers` replays from and compares with."""
    infos = describe_layers(model)
    n_layers = len(infos)
    head = output_head(model, input_ids, kl)
    recorder = _prefix_recorder(menu, layers, input_ids.shape[1], reads) if replay and head is not None else None
    final, layer_outputs, stats_taps = _baseline_pass(model, session, input_ids, n_layers, head, recorder)
    baseline = (MaterializedBaseline(final, input_ids) if head is None
                else Baseline(head, final, input_ids, sample=parse_kl(kl), seed=seed))
    del final
    stats_rows, calibration = _stats_rows(infos, stats_taps)
    has_rope = {i: session.rope.get(i) is not None for i in range(n_layers)}
    return Cells(model, session, input_ids, menu, infos, head, recorder, baseline, layer_outputs, calibration,
                 stats_rows, has_rope, variants_per_pass, replay, screen, check_reads(reads))


def profile_shard(cells: Cells, layer: int, tensors=("K", "V"), on_cell=None) -> dict:
    """The cells of one layer's `tensors`: a whole layer's part (a local run), or one tensor (a Ray shard)."""
    t0 = time.time()
    part = profile_layer(cells.model, cells.session, layer, cells.infos[layer], cells.input_ids, cells.baseline,
                         cells.layer_outputs, [(t, s) for t, s in cells.shards(layer) if t in tensors],
                         cells.calibration, cells.variants_per_pass, cells.replay, on_cell=on_cell, head=cells.head,
                         seconds=cells.seconds, recorder=cells.recorder, screen=cells.screen, reads=cells.reads)
    part["wall_time_s"] = time.time() - t0
    return part


def join_shards(layer: int, shards: list[dict]) -> dict:
    """One layer's part from its tensors' shards, in the order Cells.shards gives them: as a local run writes it."""
    return {"layer": layer, "rows": [r for s in shards for r in s["rows"]],
            "heads": [r for s in shards for r in s["heads"]],
            "wall_time_s": sum(s["wall_time_s"] for s in shards)}


def run_meta(cells: Cells, settings: dict, *, model_id: str, text_name: str, seed: int, kl: str,
             extra_meta: dict | None = None) -> dict:
    """meta.json of a run, less what PartsStore.save_meta keeps up to date (layers done, times, memory)."""
    infos, menu, session = cells.infos, cells.menu, cells.session
    return {
        "format_version": FORMAT_VERSION, "kind": KIND, "settings": settings,
        "model": {"id": model_id, "fingerprint": settings["model_fingerprint"], "class": type(cells.model).__name__},
        "layers": layer_infos_to_json(infos), "has_rope": [cells.has_rope[i] for i in range(len(infos))],
        "schemes": {s.name: {"description": s.description, "revision": scheme_revision(s.name),
                             "bits_per_element": {str(hd): bits_per_element(s, hd)
                                                  for hd in sorted({i.head_dim for i in infos})}}
                    for s in menu.schemes},
        "text": text_name, "token_count": int(cells.input_ids.numel()), "seed": seed,
        "versions": _versions(), "replay": cells.replay, "kl_compared": "materialized" if cells.head is None else kl,
        "screen": cells.screen, "reads": cells.reads,
        "attention": {"untapped": "sdpa" if session.fast else "eager", "suffix_replay": cells.recorder is not None},
        **(extra_meta or {}),
    }


class PartsStore:
    """The output side of a run: the parts found in `out_dir` (to resume), each new layer's part and the tables
    rebuilt after it, meta.json kept current. Without `out_dir`, the parts stay in memory."""

    def __init__(self, out_dir: str | None, settings: dict):
        self.out_dir, self.parts, self.prior_time, self.meta = out_dir, {}, 0.0, {}
        if out_dir:
            old = check_out_dir(out_dir, settings)
            if old is not None:
                self.parts = dict(load_parts(out_dir, old))
                self.prior_time = float(old.get("wall_time_s", 0.0))
            os.makedirs(os.path.join(out_dir, PARTS), exist_ok=True)

    def todo(self, layers) -> list[int]:
        return [i for i in layers if i not in self.parts]

    def finished(self, layers) -> bool:
        """Nothing left to do: the same command after completion just reads the profile."""
        return bool(self.out_dir) and not self.todo(layers) and all(
            os.path.exists(os.path.join(self.out_dir, f)) for f in (META, STATS, CALIBRATION))

    def start(self, meta: dict, stats_rows: list, calibration: dict) -> None:
        self.meta, self.stats_rows, self.calibration = meta, stats_rows, calibration
        if self.out_dir:
            write_json(os.path.join(self.out_dir, CALIBRATION), calibration)
            write_csv(os.path.join(self.out_dir, STATS), stats_rows, STATS_COLUMNS)

    def add(self, layer: int, part: dict) -> None:
        self.parts[layer] = part
        if self.out_dir:
            write_json(part_path(self.out_dir, layer), part)
            write_tables(self.out_dir, self.parts)

    def save_meta(self, run_time: float, cost_s: dict, memory: dict) -> None:
        meta = self.meta
        meta["layers_done"] = sorted(self.parts)
        meta["complete"] = len(self.parts) == len(meta["layers"])
        meta["wall_time_s"] = self.prior_time + run_time
        meta["cost_s"] = cost_s
        meta["memory"] = {k: round(v, 3) for k, v in memory.items()}
        if self.out_dir:
            write_json(os.path.join(self.out_dir, META), meta)

    def profile(self) -> Profile:
        if self.out_dir:
            return load_profile(self.out_dir)
        import pandas as pd

        from .table import HEAD_COLUMNS, TABLE_COLUMNS, WINDOW_COLUMNS, window_rows
        rows = [r for i in sorted(self.parts) for r in self.parts[i]["rows"]]
        heads = [r for i in sorted(self.parts) for r in self.parts[i]["heads"]]
        return Profile(pd.DataFrame(rows, columns=TABLE_COLUMNS), pd.DataFrame(heads, columns=HEAD_COLUMNS),
                       pd.DataFrame(self.stats_rows, columns=STATS_COLUMNS), self.meta, self.calibration, None,
                       pd.DataFrame(window_rows(self.parts), columns=WINDOW_COLUMNS))


def check_run(model, layers, variants_per_pass: int, kl: str, screen: bool, replay: bool) -> list[int]:
    """The layers to profile, sorted; refuses layers out of range and options that cannot run."""
    n_layers = len(describe_layers(model))
    layers = list(range(n_layers)) if layers is None else sorted(set(layers))
    if any(i < 0 or i >= n_layers for i in layers):
        raise SensprofError(f"layers {layers} out of range: the model has layers 0-{n_layers - 1}")
    if variants_per_pass < 1:
        raise SensprofError("--variants-per-pass must be at least 1")
    check_modes(kl, screen, replay)
    return layers


def as_menu(schemes: Menu | list[QuantScheme]) -> Menu:
    return schemes if isinstance(schemes, Menu) else Menu(tuple(schemes), tuple(schemes))


@torch.inference_mode()
def run_profile(model, input_ids: torch.Tensor, schemes: Menu | list[QuantScheme], *,
                layers: list[int] | None = None, out_dir: str | None = None, model_id: str = "model",
                text_name: str = "", text_digest: str = "", seed: int = 0, variants_per_pass: int = 1,
                replay: bool = True, kl: str = "exact", screen: bool = False, progress: bool = True,
                extra_meta: dict | None = None, reads: str = "streaming") -> Profile:
    """Profile `layers` (default all) of `model` on the token windows `input_ids` [W, T].

    `schemes` is a Menu (per tensor) or a list used for both K and V. `kl`: exact (vocabulary chunks, the
    default), sampled:K (opt-in approximation: top-K plus K tail samples per position) or materialized (full
    [tokens, vocab] logits, as --naive). `screen` (opt-in): end-to-end passes only for the cells that can lie
    on a layer's cost-damage hull, a predicted KL for the rest (sensprof.screen). `reads`: streaming (default:
    incomplete key groups, sinks and residual windows read unquantized, as sensprof's runtime and KIVI hold them) or
    all (every cached token read quantized, as an engine without residual windows reads it). With `out_dir`,
    results are written per layer and an interrupted run resumes where it stopped.
    """
    from tqdm.auto import tqdm

    t0 = time.time()
    layers = check_run(model, layers, variants_per_pass, kl, screen, replay)
    menu = as_menu(schemes)
    input_ids = input_ids.to(_input_device(model))
    settings = profile_settings(model, input_ids, menu, text_digest=text_digest, seed=seed,
                                variants_per_pass=variants_per_pass, kl=kl, screen=screen, reads=check_reads(reads))
    store = PartsStore(out_dir, settings)
    todo = store.todo(layers)
    if store.finished(layers):
        return store.profile()
    with attention_taps(model) as session:
        cells = baseline_cells(model, session, input_ids, menu, todo, kl=kl, seed=seed,
                               variants_per_pass=variants_per_pass, replay=replay, screen=screen, reads=reads)
        store.start(run_meta(cells, settings, model_id=model_id, text_name=text_name, seed=seed, kl=kl,
                             extra_meta=extra_meta), cells.stats_rows, cells.calibration)

        def save_meta():
            store.save_meta(time.time() - t0, cells.cost_s(), peak_memory())

        save_meta()
        n_cells = sum(len(s) for i in todo for _, s in cells.shards(i))
        bar = tqdm(total=n_cells, unit="cell", desc="profiling", disable=not progress, dynamic_ncols=True)
        try:
            for layer in todo:
                bar.set_postfix_str(f"layer {layer}")
                store.add(layer, profile_shard(cells, layer, on_cell=bar.update))
                save_meta()
        finally:
            bar.close()
    save_meta()
    return store.profile()
