"""Text to token windows: the built-in corpus (Python's own docs) or the user's files."""

from __future__ import annotations

import hashlib
import json
import os
import random

from .errors import SensprofError


def builtin_corpus() -> str:
    """Real English prose that ships with every Python: the pydoc topic pages."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def read_text_file(path: str) -> str:
    """Plain text, or JSONL whose lines carry a `text` field."""
    if os.path.isdir(path):
        raise SensprofError(f"--text {path!r} is a folder, not a file; pass a plain-text or JSONL file")
    if not os.path.isfile(path):
        raise SensprofError(f"text file {path!r} does not exist; check --text")
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except UnicodeDecodeError:
        raise SensprofError(f"text file {path!r} is not UTF-8 text; pass plain text or JSONL") from None
    if path.endswith((".jsonl", ".json")):
        parts = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise SensprofError(f"{path}:{n} is not valid JSON; JSONL needs one object per line") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise SensprofError(f"{path}:{n} has no string 'text' field; JSONL lines need {{\"text\": ...}}")
            parts.append(obj["text"])
        return "\n\n".join(parts)
    return raw


def load_text(paths: list[str] | None) -> tuple[str, str]:
    """Return (text, a name for the metadata)."""
    if not paths:
        return builtin_corpus(), "builtin:pydoc_data.topics"
    return "\n\n".join(read_text_file(p) for p in paths), ",".join(os.path.basename(p) for p in paths)


def tokenize(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def bos_prefix(tokenizer) -> list[int]:
    """The tokens the tokenizer itself puts before a text (a BOS for most Llama-likes, none for some)."""
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    for i in range(len(ids) - len(bare) + 1):
        if ids[i:i + len(bare)] == bare:
            return ids[:i]  # what comes after the text (an EOS, say) is not a prefix
    return []


PROFILE_FLAGS = ("--text", "--windows", "--seq-len")  # what a user changes to get other windows, per command
SELECT_FLAGS = ("--select-text", "--select-measured", "--select-seq-len")


def make_windows(tokens: list[int], seq_len: int, n_windows: int, seed: int = 0,
                 prefix: list[int] | None = None, exclude: set[int] | None = None, flags=PROFILE_FLAGS):
    """Pick n non-overlapping windows from aligned slots, deterministically for a seed.

    Returns (tensor [n, seq_len], slot indices) so another stage can take windows other than these.
    """
    import torch

    prefix = prefix or []
    if n_windows < 1:
        raise SensprofError(f"--windows {n_windows} is too few; use at least 1")
    body = seq_len - len(prefix)
    if seq_len < 2 or body < 1:
        raise SensprofError(f"--seq-len {seq_len} is too short; use at least {len(prefix) + 2}")
    slots = len(tokens) // body
    if slots < 1:
        raise SensprofError(
            f"the text has {len(tokens)} tokens, shorter than one window of {seq_len}; pass a longer --text "
            "or a smaller --seq-len")
    free = [s for s in range(slots) if not exclude or s not in exclude]
    if len(free) < n_windows:
        raise SensprofError(
            f"the text holds {len(free)} free windows of {seq_len} tokens but {n_windows} were asked for; "
            f"pass a longer {flags[0]}, fewer {flags[1]} or a smaller {flags[2]}")
    chosen = sorted(random.Random(seed).sample(free, n_windows))
    rows = [prefix + tokens[s * body:(s + 1) * body] for s in chosen]
    return torch.tensor(rows, dtype=torch.long), chosen


def overlapping_slots(slots, body: int, new_body: int) -> set[int]:
    """Slots of `new_body` tokens that share a token with any of the given slots of `body` tokens: windows of
    another length that would hold text a profile already read."""
    out = set()
    for s in slots:
        lo, hi = s * body, (s + 1) * body  # [lo, hi) in the token stream
        out.update(range(lo // new_body, (hi - 1) // new_body + 1))
    return out


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_seq_lens(spec, limit: int | None = None) -> list[int]:
    """--seq-len 256 or 256,1024,4096 -> sorted distinct lengths."""
    from .specs import parse_list

    def length(x: str) -> int:
        if not x.lstrip("-").isdigit():
            raise SensprofError(f"--seq-len {spec!r} is not a number or a comma-separated list such as 256,1024")
        return int(x)

    lengths = sorted(set(parse_list(spec, "--seq-len", length, "256,1024")))
    if lengths[0] < 2:
        raise SensprofError(f"--seq-len {lengths[0]} is too short; use at least 2")
    if limit is not None and lengths[-1] > limit:
        raise SensprofError(f"--seq-len {lengths[-1]} is beyond the model's {limit} positions; use lengths <= {limit}")
    return lengths


def select_windows(tokenizer, text_files, seq_len: int, windows: int, seed: int = 0, exclude=None,
                   flags=PROFILE_FLAGS):
    """Deterministic token windows: (ids [W, T], text name, text digest, slot indices).

    The slots let a later stage (validation) take windows other than the profiled ones.
    """
    if seq_len < 2:
        raise SensprofError(f"--seq-len {seq_len} is too short; use at least 2")
    return text_windows(tokenizer, *load_text(text_files), seq_len, windows, seed, exclude, flags)


def text_windows(tokenizer, text: str, name: str, seq_len: int, windows: int, seed: int = 0, exclude=None,
                 flags=PROFILE_FLAGS):
    """select_windows of a text already read: a Ray worker gets the driver's text, not its files."""
    ids, slots = make_windows(tokenize(tokenizer, text), seq_len, windows, seed, bos_prefix(tokenizer), exclude,
                              flags)
    return ids, name, text_digest(text), slots


def load_windows(tokenizer, text_files, seq_len: int, windows: int, seed: int = 0, exclude=None):
    """Deterministic token windows from the built-in corpus or files: (ids [W, T], text name, digest)."""
    return select_windows(tokenizer, text_files, seq_len, windows, seed, exclude)[:3]
