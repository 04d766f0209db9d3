"""The built-in corpora: real text that ships with every Python, named so that a profile can be re-read later.

The default mixes three kinds, passage by passage, so that a profile made without `--text` does not fit one domain:
prose (the pydoc topic pages), code (standard-library modules' source) and structured records (Unicode character
data as JSON lines). The older prose-only corpus stays readable under its name: plans profiled on it still
validate against the very windows they were made from.
"""

from __future__ import annotations

import functools
import importlib.util
import json

from .errors import SensprofError

PYDOC_NAME = "builtin:pydoc_data.topics"
MIX_NAME = "builtin:mix-v1(pydoc prose, stdlib code, unicodedata records)"
BUILTIN_NAME = MIX_NAME  # what a profile reads when no --text is given

# Standard-library modules present as source in CPython 3.10-3.13. argparse, calendar, difflib and textwrap are left
# out on purpose: they are the held-out code docs/measurements.md judged plans on before this corpus existed.
CODE_MODULES = ("functools", "dataclasses", "json.decoder", "json.encoder", "shutil", "tempfile", "typing",
                "collections", "string", "heapq", "fractions", "statistics", "csv")
PASSAGE_CHARS = 2000  # about 500 tokens: a 1024-token window spans two kinds, a 4096-token one all three
# Records take about 2.2 characters a token where prose and code take about 4 (SmolLM2's tokenizer: 113,108 tokens
# for pydoc's 465,126 characters, 132,076 for the code's 509,980, 192,048 for 431,127 of records), so their passages
# are shorter: each kind gets about a third of the tokens.
RECORD_PASSAGE_CHARS = 1100


def pydoc_topics() -> str:
    """English technical prose: the pydoc topic pages."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def stdlib_code() -> list[str]:
    """The source of CODE_MODULES, one string each (a module a Python ships without source is skipped)."""
    out = []
    for name in CODE_MODULES:
        spec = importlib.util.find_spec(name)
        origin = getattr(spec, "origin", None) or ""
        if origin.endswith(".py"):
            with open(origin, encoding="utf-8") as f:
                out.append(f.read())
    return out


def unicode_records() -> list[str]:
    """One JSON line per named character of the Basic Multilingual Plane, from the Unicode database Python ships."""
    import unicodedata as ud

    lines = []
    for cp in range(0x20, 0x10000):
        ch = chr(cp)
        name = ud.name(ch, "")
        if not name or ud.category(ch) in ("Cs", "Co", "Cn", "Zl", "Zp"):
            continue
        rec = {"code": f"U+{cp:04X}", "char": ch, "name": name, "category": ud.category(ch),
               "bidi": ud.bidirectional(ch), "decomposition": ud.decomposition(ch),
               "east_asian_width": ud.east_asian_width(ch)}
        if ch.lower() != ch:
            rec["lower"] = ch.lower()
        if ud.numeric(ch, None) is not None:
            rec["numeric"] = str(ud.numeric(ch))
        lines.append(json.dumps(rec, ensure_ascii=False))
    return lines


def passages(blocks: list[str], sep: str, size: int = PASSAGE_CHARS) -> list[str]:
    """Whole blocks (paragraphs, lines) joined by `sep` until a passage holds `size` characters."""
    out, cur, n = [], [], 0
    for b in blocks:
        cur.append(b)
        n += len(b) + len(sep)
        if n >= size:
            out.append(sep.join(cur))
            cur, n = [], 0
    if cur:
        out.append(sep.join(cur))
    return out


def _paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


def mixed_corpus() -> str:
    """Prose, code and records in turn, a passage of each, until one kind runs out: no passage appears twice."""
    kinds = [passages(_paragraphs(pydoc_topics()), "\n\n"),
             passages([p for src in stdlib_code() for p in _paragraphs(src)], "\n\n")]
    n = min(len(k) for k in kinds)
    records = unicode_records()  # every script of the plane, not its first few: an even stride through it
    stride = max(1, sum(map(len, records)) // (n * RECORD_PASSAGE_CHARS))
    kinds.append(passages(records[::stride], "\n", RECORD_PASSAGE_CHARS))
    n = min(n, len(kinds[-1]))
    return "\n\n".join(k[i] for i in range(n) for k in kinds)


CORPORA = {MIX_NAME: mixed_corpus, PYDOC_NAME: pydoc_topics}


@functools.lru_cache(maxsize=4)
def builtin_corpus(name: str = BUILTIN_NAME) -> str:
    """A built-in corpus by the name a profile records."""
    if name not in CORPORA:
        raise SensprofError(f"the built-in corpus {name!r} is not in this version of sensprof (it has "
                            f"{', '.join(map(repr, CORPORA))}); re-profile, or pass that text with --text")
    return CORPORA[name]()


def is_builtin(name: str | None) -> bool:
    return bool(name) and name.startswith("builtin:")
