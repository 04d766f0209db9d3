"""Which profile a model gets when the user names no length, windows, menus or KL.

Two 256-token windows of the default menus suit a model whose attention sees the whole context. A model with sliding
windows of 256 tokens or more never has them pass in such windows, so its plans price those layers past their window
by extrapolation; on Gemma 3 270M (512-token windows) that ranked its layers wrongly and the default profile's 4-bit
plan tied the best uniform setting at 1024 tokens (0.942x), where one 1024-token window with the long menu and
sampled KL measured 0.490x, in 0.39x the profiling time (docs/plan-quality.md). Such a model gets that long-context
route by default; a named flag, an engine's target or reads keep the short profile, with the note that says how to
measure past the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..constants import KL_SAMPLED_TOKENS, LONG_ROUTE

SHORT_SEQ_LEN = 256
SHORT_WINDOWS = 2
LONGEST_ROUTE = 2048  # past it the route's one window costs more than was measured; such models get the note only


@dataclass(frozen=True)
class ProfileRoute:
    seq_len: int | str
    windows: int
    menus: str | None
    kl: str
    long: bool  # the long-context route, taken for this model's sliding windows


def profile_route(sliding_windows: list[int], max_positions: int | None, vocab: int | None = None, *, seq_len=None,
                  windows=None, kl=None, menus=None, named_schemes: bool = False, naive: bool = False,
                  reads: str = "streaming", target: str | None = None) -> ProfileRoute:
    """The settings to profile with: those named, the rest short, or the long-context route where every one is
    unnamed and the model's widest sliding window is one the short windows never pass (2W <= LONGEST_ROUTE tokens,
    within the model's positions) for sensprof's own streaming target; its KL exact where the vocabulary is too
    small to sample (no more than twice the tokens sampled per position)."""
    w = max(sliding_windows, default=0)
    unnamed = seq_len is None and windows is None and kl is None and menus is None and not named_schemes
    if (unnamed and not naive and reads == "streaming" and target in (None, "sensprof")
            and SHORT_SEQ_LEN <= w and 2 * w <= min(LONGEST_ROUTE, max_positions or LONGEST_ROUTE)):
        sampled = vocab is None or vocab > 2 * KL_SAMPLED_TOKENS
        return ProfileRoute(2 * w, LONG_ROUTE["windows"], LONG_ROUTE["menus"],
                            LONG_ROUTE["kl"] if sampled else "exact", True)
    return ProfileRoute(SHORT_SEQ_LEN if seq_len is None else seq_len, SHORT_WINDOWS if windows is None else windows,
                        menus, "exact" if kl is None else kl, False)
