"""The per-layer K/V sensitivity profiler.

One baseline pass records every decoder layer's output, calibration absmax and cache statistics.
Then each cell (layer, tensor, scheme) quantizes only that tensor of that layer and replays the
model from that layer on (the layers before it would compute the baseline again).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time

import torch

from . import __version__
from .errors import SensprofError
from .hooks import attention_taps, record_layer_outputs, replay_from
from .memory import bits_per_element
from .schemes import scheme_revision
from .metrics import kl_and_dnll, log_probs, token_nll
from .models import describe_layers, fingerprint, layer_infos_to_json
from .schemes import QuantScheme
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
    write_json,
    write_tables,
)
from .taps import QuantTap, StatsTap


class Baseline:
    """Unquantized next-token distributions, kept once for every cell's comparison."""

    def __init__(self, logits: torch.Tensor, input_ids: torch.Tensor):
        logp = log_probs(logits)
        if not torch.isfinite(logp).all():
            raise SensprofError(
                "the unquantized model produced NaN/Inf logits on these windows; try --dtype float32 or "
                "a shorter --seq-len")
        self.logits = logits.float()
        self.p = logp.exp().float()
        self.mean_nll = float(token_nll(logp, input_ids).mean())

    def compare(self, logits: torch.Tensor, input_ids: torch.Tensor) -> dict:
        kl, dnll = kl_and_dnll(self.p, self.logits, logits, input_ids)
        per_window = kl.mean(-1)
        return {"kl": max(float(kl.mean()), 0.0), "kl_std": float(per_window.std()) if kl.shape[0] > 1 else 0.0,
                "dnll": float(dnll.mean())}


def _input_device(model):
    return model.get_input_embeddings().weight.device


def _versions() -> dict:
    import transformers

    return {"sensprof": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def profile_settings(model, input_ids: torch.Tensor, schemes: list[QuantScheme], *, text_digest: str,
                     seed: int, variants_per_pass: int) -> dict:
    """What must match for two runs to belong to one profile (--layers excluded)."""
    p = next(model.parameters())
    return {"model_fingerprint": fingerprint(model), "seq_len": int(input_ids.shape[1]),
            "windows": int(input_ids.shape[0]), "seed": seed, "text_digest": text_digest,
            "schemes": [s.name for s in schemes], "dtype": str(p.dtype).replace("torch.", ""),
            "device_type": p.device.type, "variants_per_pass": variants_per_pass}


def _baseline_pass(model, session, input_ids, n_layers):
    stats_taps = [StatsTap(session, i) for i in range(n_layers)]
    for i, tap in enumerate(stats_taps):
        session.set_tap(i, tap)
    outputs: dict = {}
    try:
        with record_layer_outputs(model, outputs):
            logits = model(input_ids=input_ids, use_cache=False).logits
    finally:
        session.clear_taps()
    return logits, outputs, stats_taps


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


def _cells_for_layer(schemes, has_rope):
    for tensor in ("K", "V"):
        yield tensor, [s for s in schemes if s.applies_to(tensor) and not s.is_identity
                       and (has_rope or not s.pre_rope)]


def profile_layer(model, session, layer, info, input_ids, baseline, layer_outputs, schemes_by_tensor,
                  calibration, variants_per_pass=1, replay=True, on_cell=None) -> dict:
    """All cells of one layer: end-to-end and local damage for each (tensor, scheme)."""
    rows, heads = [], []
    w = input_ids.shape[0]
    cal = {k: torch.tensor(v) for k, v in calibration.get(str(layer), {}).items()}
    for tensor, schemes in schemes_by_tensor:
        for start in range(0, len(schemes), variants_per_pass):
            chunk = schemes[start:start + variants_per_pass]
            pairs = [(s, None) if tensor == "K" else (None, s) for s in chunk]
            tap = QuantTap(session, layer, pairs, w, cal)
            session.set_tap(layer, tap)
            try:
                ids = input_ids.repeat(len(chunk), 1)
                ctx = replay_from(model, layer, layer_outputs, repeat=len(chunk)) if replay else contextlib.nullcontext()
                with ctx:
                    logits = model(input_ids=ids, use_cache=False).logits
            finally:
                session.clear_taps()
            for i, scheme in enumerate(chunk):
                m = baseline.compare(logits[i * w:(i + 1) * w], input_ids)
                attn_kl, rel = tap.local[i]
                rows.append({"layer": layer, "layer_kind": info.kind, "tensor": tensor, "scheme": scheme.name,
                             "bits": bits_per_element(scheme, info.head_dim), **m,
                             "attn_kl": float(attn_kl.mean()), "out_rel_l2": float(rel.mean())})
                for h in range(attn_kl.shape[0]):
                    heads.append({"layer": layer, "tensor": tensor, "scheme": scheme.name, "head": h,
                                  "attn_kl": float(attn_kl[h]), "out_rel_l2": float(rel[h])})
                if on_cell:
                    on_cell()
    return {"layer": layer, "rows": rows, "heads": heads}


@torch.inference_mode()
def run_profile(model, input_ids: torch.Tensor, schemes: list[QuantScheme], *, layers: list[int] | None = None,
                out_dir: str | None = None, model_id: str = "model", text_name: str = "", text_digest: str = "",
                seed: int = 0, variants_per_pass: int = 1, replay: bool = True, progress: bool = True,
                extra_meta: dict | None = None) -> Profile:
    """Profile `layers` (default all) of `model` on the token windows `input_ids` [W, T].

    With `out_dir`, results are written per layer and an interrupted run resumes where it stopped.
    """
    from tqdm.auto import tqdm

    t0 = time.time()
    infos = describe_layers(model)
    n_layers = len(infos)
    layers = list(range(n_layers)) if layers is None else sorted(set(layers))
    if any(i < 0 or i >= n_layers for i in layers):
        raise SensprofError(f"layers {layers} out of range: the model has layers 0-{n_layers - 1}")
    if variants_per_pass < 1:
        raise SensprofError("--variants-per-pass must be at least 1")
    input_ids = input_ids.to(_input_device(model))
    settings = profile_settings(model, input_ids, schemes, text_digest=text_digest, seed=seed,
                                variants_per_pass=variants_per_pass)
    parts: dict[int, dict] = {}
    prior_time = 0.0
    if out_dir:
        old = check_out_dir(out_dir, settings)
        if old is not None:
            parts = {k: v for k, v in load_parts(out_dir).items()}
            prior_time = float(old.get("wall_time_s", 0.0))
        os.makedirs(os.path.join(out_dir, PARTS), exist_ok=True)

    todo = [i for i in layers if i not in parts]
    if out_dir and not todo and all(os.path.exists(os.path.join(out_dir, f)) for f in (META, STATS, CALIBRATION)):
        return load_profile(out_dir)  # nothing left to do: the same command after completion just reads
    with attention_taps(model) as session:
        logits, layer_outputs, stats_taps = _baseline_pass(model, session, input_ids, n_layers)
        baseline = Baseline(logits, input_ids)
        del logits
        stats_rows, calibration = _stats_rows(infos, stats_taps)
        has_rope = {i: session.rope.get(i) is not None for i in range(n_layers)}
        meta = {
            "format_version": FORMAT_VERSION, "kind": KIND, "settings": settings,
            "model": {"id": model_id, "fingerprint": settings["model_fingerprint"],
                      "class": type(model).__name__},
            "layers": layer_infos_to_json(infos), "has_rope": [has_rope[i] for i in range(n_layers)],
            "schemes": {s.name: {"description": s.description, "revision": scheme_revision(s.name),
                                 "bits_per_element": {str(hd): bits_per_element(s, hd)
                                                      for hd in sorted({i.head_dim for i in infos})}}
                        for s in schemes},
            "text": text_name, "token_count": int(input_ids.numel()), "seed": seed,
            "versions": _versions(), "replay": replay, **(extra_meta or {}),
        }
        if out_dir:
            write_json(os.path.join(out_dir, CALIBRATION), calibration)
            write_csv(os.path.join(out_dir, STATS), stats_rows, STATS_COLUMNS)

        def save_meta(run_time):
            meta["layers_done"] = sorted(parts)
            meta["complete"] = len(parts) == n_layers
            meta["wall_time_s"] = prior_time + run_time
            if out_dir:
                write_json(os.path.join(out_dir, META), meta)

        save_meta(time.time() - t0)
        n_cells = sum(len(s) for i in todo for _, s in _cells_for_layer(schemes, has_rope[i]))
        bar = tqdm(total=n_cells, unit="cell", desc="profiling", disable=not progress, dynamic_ncols=True)
        try:
            for layer in todo:
                lt = time.time()
                bar.set_postfix_str(f"layer {layer}")
                part = profile_layer(model, session, layer, infos[layer], input_ids, baseline, layer_outputs,
                                     list(_cells_for_layer(schemes, has_rope[layer])), calibration,
                                     variants_per_pass, replay, on_cell=bar.update)
                part["wall_time_s"] = time.time() - lt
                parts[layer] = part
                if out_dir:
                    write_json(part_path(out_dir, layer), part)
                    write_tables(out_dir, parts)
                    save_meta(time.time() - t0)
        finally:
            bar.close()
    save_meta(time.time() - t0)
    if out_dir:
        return load_profile(out_dir)
    import pandas as pd

    from .table import HEAD_COLUMNS, TABLE_COLUMNS
    rows = [r for i in sorted(parts) for r in parts[i]["rows"]]
    heads = [r for i in sorted(parts) for r in parts[i]["heads"]]
    return Profile(pd.DataFrame(rows, columns=TABLE_COLUMNS), pd.DataFrame(heads, columns=HEAD_COLUMNS),
                   pd.DataFrame(stats_rows, columns=STATS_COLUMNS), meta, calibration, None)
