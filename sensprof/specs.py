"""Lists a user types on the command line: '0-11,14', '256,1024', 'int4_c32,fp8'. One parser, one message."""

from __future__ import annotations

from .errors import SensprofError


def parse_list(spec, flag: str, convert=str, example: str = "") -> list:
    """'a,b,c' (or a list) -> converted items, blanks dropped; a bad item names the flag and an example."""
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    out = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        try:
            out.append(convert(item))
        except (TypeError, ValueError):
            raise SensprofError(f"{flag} {spec!r}: {item!r} is not valid; pass a comma-separated list"
                                + (f" such as {example}" if example else "")) from None
    if not out:
        raise SensprofError(f"{flag} {spec!r} is empty; pass a comma-separated list" + (f" such as {example}" if example else ""))
    return out


def compact_ranges(xs) -> str:
    xs = sorted(xs)
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def parse_layers(spec: str | None, n_layers: int) -> list[int]:
    """'0-11', '3', '0,5,7-9' -> sorted indices; refuses out-of-range or malformed specs."""
    if spec is None or spec == "" or spec == "all":
        return list(range(n_layers))
    out = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
            else:
                lo = hi = int(part)
        except ValueError:
            raise SensprofError(f"--layers {spec!r} is malformed; use e.g. 0-11 or 0,3,5-7") from None
        if lo > hi or lo < 0 or hi >= n_layers:
            raise SensprofError(
                f"--layers {spec!r} is out of range: the model has layers 0-{n_layers - 1}")
        out.update(range(lo, hi + 1))
    return sorted(out)
