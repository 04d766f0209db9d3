"""Numbers several modules must agree on, defined once. Imports nothing."""

from __future__ import annotations

FP8_E4M3_MAX = 448.0  # the largest finite float8 e4m3fn value (OCP; ROCm's fnuz e4m3 stops at 240)
FP8_E5M2_MAX = 57344.0
FP8_MAX = {"fp8_e4m3": FP8_E4M3_MAX, "fp8_e5m2": FP8_E5M2_MAX}  # by sensprof's format name
GIB = 2**30
KL_SAMPLED_TOKENS = 256  # --kl sampled's tokens per position where sampled:K names none
# The long-context route's profile settings besides its length (sensprof.profiling.route takes them by default for a
# model whose sliding windows the short profile never passes; sensprof.planning.pricing names them in its notes).
LONG_ROUTE = {"windows": 1, "menus": "long", "kl": "sampled"}
