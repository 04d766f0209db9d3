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
RECORD_CHARS = 146  # a record's mean length (8,136,541 characters for the plane's 55,567 in Python 3.11)


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


def named_code_points() -> list[int]:
    """The Basic Multilingual Plane's named characters (no surrogates, private use or line/paragraph separators)."""
    import unicodedata as ud

    return [cp for cp in range(0x20, 0x10000)
            if ud.name(chr(cp), "") and ud.category(chr(cp)) not in ("Cs", "Co", "Cn", "Zl", "Zp")]


def unicode_records(code_points: list[int] | None = None) -> list[str]:
    """One JSON line per character (default: every named one of the plane), from the Unicode database Python
    ships."""
    import unicodedata as ud

    lines = []
    for cp in named_code_points() if code_points is None else code_points:
        ch = chr(cp)
        name = ud.name(ch)
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


def spread(items: list, n: int) -> list:
    """n of the items, evenly spaced from first to last, in order (each at most once)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


KIND_SEPARATORS = {"prose": "\n\n", "code": "\n\n", "records": "\n"}  # what joins a kind's passages


def kind_passages(record_chars: int | None = None) -> dict[str, list[str]]:
    """Each kind's passages in source order: what the mixture interleaves, and what a benchmark reads kind by kind.
    Records are an even stride through the plane's characters, about `record_chars` characters of them (default:
    as many as the mixture takes, a third of its tokens)."""
    prose = passages(_paragraphs(pydoc_topics()), "\n\n")
    code = passages([p for src in stdlib_code() for p in _paragraphs(src)], "\n\n")
    points = named_code_points()  # every script of the plane, not its first few
    if record_chars is None:
        record_chars = len(prose) // 3 * RECORD_PASSAGE_CHARS
    stride = max(1, len(points) * RECORD_CHARS // record_chars)
    records = passages(unicode_records(points[::stride]), "\n", RECORD_PASSAGE_CHARS)
    return {"prose": prose, "code": code, "records": records}


def kind_texts(kinds=None, record_chars: int | None = None) -> dict[str, str]:
    """{kind: its passages joined} for the mixture's `kinds` (default all): text of one kind, to measure a plan or a
    cell on kind by kind."""
    from .errors import SensprofError

    kinds = list(KIND_SEPARATORS) if kinds is None else list(kinds)
    unknown = [k for k in kinds if k not in KIND_SEPARATORS]
    if unknown:
        raise SensprofError(f"no kind {', '.join(unknown)} in the built-in mixture; choose from "
                            f"{', '.join(KIND_SEPARATORS)}")
    each = kind_passages(record_chars) if kinds else {}
    return {kind: KIND_SEPARATORS[kind].join(each[kind]) for kind in kinds}


def mixed_corpus() -> str:
    """Prose, code and records in turn, a passage of each, each kind spread over all its source (every topic, every
    module, every script); as many tokens in all as the prose alone held, so that choosing windows costs what it
    did (tokenizing the text is most of it). No passage appears twice."""
    each = kind_passages()
    n = len(each["prose"]) // 3
    kinds = [spread(each[kind], n) for kind in ("prose", "code", "records")]
    n = min(map(len, kinds))
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
