"""Text to token windows: a built-in corpus (corpus.py) or the user's files."""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass

from .corpus import BUILTIN_NAME, PYDOC_NAME, builtin_corpus, is_builtin  # noqa: F401  (read through here)
from .errors import SensprofError

JSONL = (".jsonl", ".json")  # read one object a line: {"text": ...} or {"messages": [{"role", "content"}, ...]}


@dataclass(frozen=True)
class Text:
    """The user's text as read from files, folders and JSONL, checked; chats (JSONL `messages`) stay unrendered
    until the model's tokenizer is at hand (render), so bad files are refused before the model loads."""
    parts: tuple  # (part, where): a str, or a chat (a list of {role, content}) and the "file:line" it came from
    files: tuple  # every file read, absolute, in order (a folder's text files, sorted)
    name: str  # for tables and messages: the basenames of the paths as given

    def render(self, tokenizer=None) -> str:
        return "\n\n".join(p if isinstance(p, str) else render_chat(tokenizer, p, where) for p, where in self.parts)

    def digest(self, tokenizer=None) -> str:
        return text_digest(self.render(tokenizer))

    @property
    def has_chats(self) -> bool:
        return any(not isinstance(p, str) for p, _ in self.parts)


def render_chat(tokenizer, messages: list, where: str) -> str:
    """A chat as the model reads it: its tokenizer's chat template, as text (tokenize=False)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise SensprofError(f"{where} is a chat ('messages'), but the model's tokenizer has no chat template to render "
                            "it with; pass {\"text\": ...} lines instead, or a model that has a chat template")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # the template's own check (alternating roles, say)
        raise SensprofError(f"{where}: the model's chat template cannot render these messages: "
                            f"{(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None


def _jsonl_parts(path: str, raw: str) -> list:
    parts = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise SensprofError(f"{path}:{n} is not valid JSON; JSONL needs one object per line") from None
        chat = obj.get("messages") if isinstance(obj, dict) else None
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            parts.append((obj["text"], f"{path}:{n}"))
        elif isinstance(chat, list) and chat and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                     and "content" in m for m in chat):
            parts.append((chat, f"{path}:{n}"))
        else:
            raise SensprofError(f"{path}:{n} has no string 'text' field nor a 'messages' chat; JSONL lines need "
                                "{\"text\": ...} or {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}")
    return parts


def _read_file(path: str, flag: str, skip_binary: bool = False) -> list | None:
    """A file's parts; None for a binary one when `skip_binary` (a folder's), refused otherwise."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError:
        if skip_binary:
            return None
        raise SensprofError(f"{flag} {path} is not UTF-8 text; pass plain text or JSONL") from None
    if "\x00" in raw:
        if skip_binary:
            return None
        raise SensprofError(f"{flag} {path} holds NUL bytes, so it is binary, not text; pass plain text or JSONL")
    return _jsonl_parts(path, raw) if path.endswith(JSONL) else [(raw, path)]


def folder_files(folder: str) -> list[str]:
    """Every regular file under `folder`, sorted by its path there; hidden files and folders (.name) left out."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out += [os.path.join(root, f) for f in files if not f.startswith(".") and os.path.isfile(os.path.join(root, f))]
    return sorted(out, key=lambda f: os.path.relpath(f, folder))


def read_texts(paths: list[str], flag: str = "--text") -> Text:
    """The one reader of the user's text for every command: files (plain text, or JSONL of {"text": ...} or
    {"messages": [...]} lines), and folders (every file under it, sorted; hidden files and files that are not UTF-8
    text skipped). Refused in one line: a missing path, a named file that is binary, bad JSONL, a folder with no
    text file, or no text at all."""
    parts, files = [], []
    for path in paths:
        if os.path.isdir(path):
            found = [(f, _read_file(f, flag, skip_binary=True)) for f in folder_files(path)]
            found = [(f, p) for f, p in found if p is not None]
            if not found:
                raise SensprofError(f"{flag} {path} is a folder with no text file in it (hidden files and files that "
                                    "are not UTF-8 text are skipped); pass a folder of text or JSONL files")
        elif os.path.isfile(path):
            found = [(path, _read_file(path, flag))]
        elif os.path.exists(path):  # a FIFO or a device: opening it could hang or never end
            raise SensprofError(f"{flag} {path} is not a regular file or folder; pass a text file, JSONL or a folder")
        else:
            raise SensprofError(f"text file {path!r} does not exist; check {flag}")
        for f, p in found:
            files.append(os.path.abspath(f))
            parts += p
    name = ",".join(os.path.basename(os.path.normpath(p)) for p in paths)
    if not any(not isinstance(p, str) or p.strip() for p, _ in parts):
        raise SensprofError(f"{flag} {name} is empty; pass a file with text in it")
    return Text(tuple(parts), tuple(files), name)


def read_text_file(path: str, tokenizer=None) -> str:
    """One file's text (plain, or JSONL's lines joined by blank lines)."""
    return read_texts([path]).render(tokenizer)


def text_source(paths: list[str] | None, flag: str = "--text", builtin: str | None = None) -> tuple:
    """(a built-in corpus, its name: `builtin`, the name a profile recorded, or the default), or (the user's Text,
    read and checked but not yet rendered, its name)."""
    if not paths:
        name = builtin if is_builtin(builtin) else BUILTIN_NAME
        return builtin_corpus(name), name
    text = read_texts(paths, flag)
    return text, text.name


def rendered(text, tokenizer=None) -> str:
    return text if isinstance(text, str) else text.render(tokenizer)


def load_text(paths: list[str] | None, tokenizer=None, builtin: str | None = None) -> tuple[str, str]:
    """Return (text, a name for the metadata); chats are rendered with `tokenizer`'s chat template."""
    text, name = text_source(paths, builtin=builtin)
    return rendered(text, tokenizer), name


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
            f"the text has {len(tokens)} tokens, shorter than one window of {seq_len}; pass a longer {flags[0]} "
            f"or a smaller {flags[2]}")
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
                   flags=PROFILE_FLAGS, builtin: str | None = None):
    """Deterministic token windows: (ids [W, T], text name, text digest, slot indices).

    The slots let a later stage (validation) take windows other than the profiled ones.
    """
    if seq_len < 2:
        raise SensprofError(f"--seq-len {seq_len} is too short; use at least 2")
    return text_windows(tokenizer, *text_source(text_files, builtin=builtin), seq_len, windows, seed, exclude, flags)


def text_windows(tokenizer, text, name: str, seq_len: int, windows: int, seed: int = 0, exclude=None,
                 flags=PROFILE_FLAGS):
    """select_windows of a text already read (a str, or a Text whose chats the tokenizer renders): a Ray worker
    gets the driver's text, not its files."""
    text = rendered(text, tokenizer)
    ids, slots = make_windows(tokenize(tokenizer, text), seq_len, windows, seed, bos_prefix(tokenizer), exclude,
                              flags)
    return ids, name, text_digest(text), slots


def load_windows(tokenizer, text_files, seq_len: int, windows: int, seed: int = 0, exclude=None,
                 builtin: str | None = None):
    """Deterministic token windows from a built-in corpus or files: (ids [W, T], text name, digest)."""
    return select_windows(tokenizer, text_files, seq_len, windows, seed, exclude, builtin=builtin)[:3]
