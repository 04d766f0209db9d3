"""The Python entry points: profile a model in one call and get pandas tables back."""

from __future__ import annotations

from .data import bos_prefix, load_text, make_windows, text_digest, tokenize
from .errors import SensprofError


def select_windows(tokenizer, text_files, seq_len: int, windows: int, seed: int = 0, exclude=None):
    """Deterministic token windows: (ids [W, T], text name, text digest, slot indices).

    The slots let a later stage (validation) take windows other than the profiled ones.
    """
    if seq_len < 2:
        raise SensprofError(f"--seq-len {seq_len} is too short; use at least 2")
    text, name = load_text(text_files)
    ids, slots = make_windows(tokenize(tokenizer, text), seq_len, windows, seed, bos_prefix(tokenizer), exclude)
    return ids, name, text_digest(text), slots


def load_windows(tokenizer, text_files, seq_len: int, windows: int, seed: int = 0, exclude=None):
    """Deterministic token windows from the built-in corpus or files: (ids [W, T], text name, digest)."""
    return select_windows(tokenizer, text_files, seq_len, windows, seed, exclude)[:3]


def profile(model="smollm2-135m", schemes=None, *, k_schemes=None, v_schemes=None, tokenizer=None, text=None,
            seq_len=256, windows=2, seed=0, layers=None, out_dir=None, device="auto", dtype=None,
            variants_per_pass=1, kl="exact", screen=False, progress=True):
    """Profile a model (an id/path/alias, or a loaded transformers model with its tokenizer).

    `schemes` go to both K and V; `k_schemes` / `v_schemes` to one (default: the per-tensor default menus).
    Returns a `Profile` whose `.table` is a pandas DataFrame (one row per layer x tensor x scheme).
    """
    from .models import load_model
    from .profile import run_profile
    from .schemes import parse_menu

    model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", type(model).__name__)
    if isinstance(model, str):
        loaded = load_model(model, device, dtype)
        model, tokenizer = loaded.model, loaded.tokenizer
    elif tokenizer is None:
        raise SensprofError("pass the tokenizer along with a loaded model")
    else:
        from .hooks import register

        register()
    ids, name, digest, slots = select_windows(tokenizer, [text] if isinstance(text, str) else text, seq_len,
                                              windows, seed)
    menu = parse_menu(schemes, k_schemes, v_schemes)
    return run_profile(model, ids, menu, layers=layers, out_dir=out_dir,
                       model_id=model_id, text_name=name, text_digest=digest, seed=seed,
                       variants_per_pass=variants_per_pass, kl=kl, screen=screen, progress=progress,
                       extra_meta={"window_slots": slots, "text_files": text})
