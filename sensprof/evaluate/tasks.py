"""Long-context probes as token sequences: pure functions of (corpus tokens, length, depth, seed).

A `Sample` is one sequence of exactly `length` tokens. The model is fed `ids[:tail_start]` (the context,
in chunks, through the cache under test) and then `ids[tail_start:]` as one last chunk; the targets are
`ids[answer_start:]`, each predicted by the logits of the position before it (teacher forcing).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ..errors import SensprofError
from ..specs import parse_list

TASKS = ("retrieval", "passkey")
NEEDLE_TOKENS = 32  # retrieval: length of the planted random token sequence
CUE_TOKENS = 4  # retrieval: the first tokens of the repeated copy are the cue, not scored
MIN_FILLER = 16  # every task keeps at least this much filler around its needle
PASSKEY_INTRO = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the pass key.\n\n")
PASSKEY_NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
PASSKEY_QUESTION = "\n\nWhat is the pass key? The pass key is"
PASSKEY_ANSWER = " {key}"


@dataclass(frozen=True)
class Sample:
    task: str
    length: int
    depth: float
    seed: int
    ids: tuple[int, ...]
    needle_start: int  # where the planted needle begins
    needle_len: int
    tail_start: int  # first token of the last (scored) chunk
    answer_start: int  # first scored target; targets run to the end of the sequence

    @property
    def targets(self) -> tuple[int, ...]:
        return self.ids[self.answer_start:]


def parse_lengths(spec: str) -> list[int]:
    """'1k,2048,4K' -> [1024, 2048, 4096] (k = 1024 tokens)."""
    def tokens(p: str) -> int:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kK]?)", p)
        if not m:
            raise SensprofError(f"--lengths: {p!r} is not a token count; use e.g. 1k,2k,4k or 2048")
        n = float(m.group(1)) * (1024 if m.group(2) else 1)
        if n != int(n) or n < 1:
            raise SensprofError(f"--lengths: {p!r} is not a whole positive number of tokens; use e.g. 1k or 2048")
        return int(n)

    return sorted(set(parse_list(spec, "--lengths", tokens, "1k,2k,4k")))


def parse_depths(spec: str) -> list[float]:
    """'0.1,0.5,0.9' -> [0.1, 0.5, 0.9]; each in [0, 1] (0: right after the start, 1: right before the end)."""
    def depth(p: str) -> float:
        try:
            d = float(p)
        except ValueError:
            raise SensprofError(f"--depths: {p!r} is not a number; use fractions in [0, 1], e.g. 0.1,0.5,0.9") from None
        if not 0.0 <= d <= 1.0:
            raise SensprofError(f"--depths: {p} is outside [0, 1]; use fractions of the context, e.g. 0.1,0.5,0.9")
        return d

    return sorted(set(parse_list(spec, "--depths", depth, "0.1,0.5,0.9")))


def format_length(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _rng(seed: int, salt: str) -> random.Random:
    return random.Random(f"sensprof-eval:{salt}:{seed}")  # str seeds are hashed: stable across runs and platforms


def _filler(corpus: list[int], n: int, seed: int) -> list[int]:
    """n contiguous corpus tokens from a seeded offset (the same offset for every depth and, unless it would
    run past the end of the corpus, every length of a seed)."""
    if n > len(corpus):
        raise SensprofError(f"the filler text has {len(corpus)} tokens, fewer than the {n} needed; use shorter --lengths")
    start = min(_rng(seed, "filler").randrange(len(corpus)), len(corpus) - n)
    return corpus[start:start + n]


def needle_position(depth: float, first: int, room: int) -> int:
    """Start index of a needle placed `depth` of the way through `room` free slots that begin at `first`."""
    return first + round(depth * room)


def min_length(task: str, prefix: list[int], tokenizer=None) -> int:
    """Shortest sequence a task can build (with MIN_FILLER filler tokens)."""
    if task == "retrieval":
        return len(prefix) + 2 * NEEDLE_TOKENS + MIN_FILLER
    if task == "passkey":
        parts = _passkey_parts(tokenizer, 12345)
        return len(prefix) + sum(len(p) for p in parts) + MIN_FILLER
    raise SensprofError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")


def retrieval_sample(corpus: list[int], length: int, depth: float, seed: int, prefix: list[int] | None = None) -> Sample:
    """A random run of NEEDLE_TOKENS corpus tokens planted at `depth` of the filler and repeated at the end.

    [prefix] filler[:a] NEEDLE filler[a:] NEEDLE; the score is top-1 accuracy on the final copy after its
    first CUE_TOKENS tokens: the model can only predict them by finding the first copy.
    """
    prefix = list(prefix or [])
    need = min_length("retrieval", prefix)
    if length < need:
        raise SensprofError(f"--lengths {length} is too short for the retrieval task; use at least {need}")
    if len(corpus) < NEEDLE_TOKENS:
        raise SensprofError("the filler text is too short to draw a needle from")
    rng = _rng(seed, "needle")
    needle = [corpus[rng.randrange(len(corpus))] for _ in range(NEEDLE_TOKENS)]
    n_fill = length - len(prefix) - 2 * NEEDLE_TOKENS
    filler = _filler(corpus, n_fill, seed)
    at = needle_position(depth, len(prefix), n_fill)
    cut = at - len(prefix)
    ids = prefix + filler[:cut] + needle + filler[cut:] + needle
    copy = length - NEEDLE_TOKENS
    return Sample("retrieval", length, depth, seed, tuple(ids), at, NEEDLE_TOKENS, copy, copy + CUE_TOKENS)


def _passkey_parts(tokenizer, key: int):
    if tokenizer is None:
        raise SensprofError("the passkey task needs the model's tokenizer")
    from ..data import tokenize

    return (tokenize(tokenizer, PASSKEY_INTRO), tokenize(tokenizer, PASSKEY_NEEDLE.format(key=key)),
            tokenize(tokenizer, PASSKEY_QUESTION), tokenize(tokenizer, PASSKEY_ANSWER.format(key=key)))


def passkey_key(seed: int) -> int:
    return _rng(seed, "passkey").randrange(10000, 100000)


def passkey_sample(corpus: list[int], tokenizer, length: int, depth: float, seed: int,
                   prefix: list[int] | None = None) -> Sample:
    """The classic pass-key probe with corpus filler: intro, filler with "The pass key is NNNNN. Remember it."
    at `depth`, then "What is the pass key? The pass key is" and the answer, scored as the last tokens."""
    prefix = list(prefix or [])
    need = min_length("passkey", prefix, tokenizer)
    if length < need:
        raise SensprofError(f"--lengths {length} is too short for the passkey task; use at least {need}")
    intro, needle, question, answer = _passkey_parts(tokenizer, passkey_key(seed))
    n_fill = length - len(prefix) - len(intro) - len(needle) - len(question) - len(answer)
    if n_fill < MIN_FILLER:  # another key can tokenize longer than the reference one
        raise SensprofError(f"--lengths {length} is too short for the passkey task; use at least {need + 8}")
    filler = _filler(corpus, n_fill, seed)
    first = len(prefix) + len(intro)
    at = needle_position(depth, first, n_fill)
    cut = at - first
    ids = prefix + intro + filler[:cut] + needle + filler[cut:] + question + answer
    tail = length - len(answer) - len(question)
    return Sample("passkey", length, depth, seed, tuple(ids), at, len(needle), tail, length - len(answer))


def build_sample(task: str, corpus: list[int], length: int, depth: float, seed: int, prefix=None,
                 tokenizer=None) -> Sample:
    if task == "retrieval":
        return retrieval_sample(corpus, length, depth, seed, prefix)
    if task == "passkey":
        return passkey_sample(corpus, tokenizer, length, depth, seed, prefix)
    raise SensprofError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")


def score(tail_logits, sample: Sample) -> dict:
    """Teacher-forced top-1 scores of the targets from the logits of the last chunk ([T_tail, V] or [1, T_tail, V]).

    `accuracy`: fraction of targets that are the argmax; `exact`: 1.0 if all are.
    """
    import torch

    logits = tail_logits[0] if tail_logits.dim() == 3 else tail_logits
    n_tail = len(sample.ids) - sample.tail_start
    if logits.shape[0] != n_tail:
        raise ValueError(f"expected logits for the {n_tail} tail positions, got {logits.shape[0]}")
    lo = sample.answer_start - 1 - sample.tail_start  # the position before the first target predicts it
    pred = logits[lo:n_tail - 1].argmax(-1)
    target = torch.tensor(sample.targets, device=pred.device)
    hits = int((pred == target).sum())
    return {"accuracy": hits / len(target), "exact": float(hits == len(target)), "scored": len(target)}
