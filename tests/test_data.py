"""Text and token windows: the built-in corpus, --text files (plain and JSONL), window selection, BOS prefix."""

from __future__ import annotations

import json
import re

import pytest
import torch

from sensprof.data import load_windows
from sensprof.corpus import CODE_MODULES, MIX_NAME, PASSAGE_CHARS
from sensprof.data import (
    BUILTIN_NAME,
    PYDOC_NAME,
    bos_prefix,
    builtin_corpus,
    load_text,
    make_windows,
    read_text_file,
    read_texts,
    text_digest,
    tokenize,
)
from sensprof.errors import SensprofError

# --------------------------------------------------------------------------- built-in corpus


def test_the_prose_corpus_is_real_english_prose():
    text = builtin_corpus(PYDOC_NAME)
    assert isinstance(text, str)
    assert len(text) > 200_000
    words = re.findall(r"[A-Za-z]+", text.lower())
    assert len(words) > 30_000
    common = {w: words.count(w) for w in ("the", "and", "of", "is", "to")}
    assert all(n > 500 for n in common.values()), common
    assert sum(c.isascii() for c in text) / len(text) > 0.99
    assert text.count(". ") > 1000  # sentences, not a word list


def test_the_default_corpus_mixes_prose_code_and_records_passage_by_passage():
    """Every stretch of ~6,000 characters holds all three kinds, each spread over all its source; no passage is
    repeated; about as many characters as the prose alone held (choosing windows costs what it did)."""
    text = builtin_corpus()
    assert BUILTIN_NAME == MIX_NAME and text == builtin_corpus(MIX_NAME)
    assert 0.7 < len(text) / len(builtin_corpus(PYDOC_NAME)) < 1.0
    prose = [p for p in builtin_corpus(PYDOC_NAME).split("\n\n") if p.strip()]
    tenth = len(prose) // 10
    assert sum(p in text for p in prose[:tenth]) > tenth / 5 and sum(p in text for p in prose[-tenth:]) > tenth / 5
    assert text.index(prose[0]) < text.index(next(p for p in prose[-tenth:] if p in text))  # in pydoc's order
    kinds = {"prose": r"\. The |\bthe\b", "code": r"\n {4,}(?:if |for |return\b|def |self\.|raise |try:|[a-z_]\w* = )", "records": r'\{"code": "U\+'}
    step = 3 * PASSAGE_CHARS + 2000
    for start in range(0, len(text) - step, len(text) // 7):
        piece = text[start:start + step]
        assert all(re.search(pat, piece) for pat in kinds.values()), (start, piece[:200])
    counts = {k: len(re.findall(pat, text)) for k, pat in kinds.items()}
    assert counts["records"] > 400 and counts["code"] > 1000, counts
    records = [json.loads(line) for line in text.splitlines() if line.startswith('{"code": "U+')]
    assert len({r["code"] for r in records}) == len(records)  # an even stride through the plane, each once
    scripts = {r["name"].split()[0] for r in records}
    assert {"LATIN", "GREEK", "CYRILLIC", "ARABIC", "CJK"} <= scripts, sorted(scripts)[:20]
    import importlib.util

    def read(module):
        with open(importlib.util.find_spec(module).origin, encoding="utf-8") as f:
            return [p for p in f.read().split("\n\n") if p.strip()]

    assert read(CODE_MODULES[0])[0] in text  # the code is the standard library's own source, from its first module
    assert sum(any(p in text for p in read(m)) for m in CODE_MODULES) >= len(CODE_MODULES) - 2  # to (nearly) its last


def test_kind_texts_join_each_kind_named_and_refuse_one_the_mixture_lacks():
    """Benchmarks measure kind by kind from kind_texts: each kind asked for, its passages joined as kind_passages
    gives them; a kind the mixture lacks is one line naming the kinds there are."""
    from sensprof.corpus import KIND_SEPARATORS, kind_passages, kind_texts
    from sensprof.errors import SensprofError

    each = kind_passages()
    both = kind_texts(["records", "prose"])
    assert list(both) == ["records", "prose"]
    assert both["records"] == KIND_SEPARATORS["records"].join(each["records"])
    assert both["prose"] == builtin_corpus(PYDOC_NAME)
    assert list(kind_texts()) == ["prose", "code", "records"]
    assert kind_texts([]) == {}
    with pytest.raises(SensprofError, match="no kind html in the built-in mixture; choose from prose, code, records"):
        kind_texts(["prose", "html"])


def test_the_mixture_interleaves_the_passages_each_kind_is_read_from_alone():
    """One source for both: the mixture's passages are those `kind_passages` gives each kind (what the corpus_kinds
    benchmark profiles alone), prose, code and records in turn; more records when more are asked for."""
    from sensprof.corpus import KIND_SEPARATORS, kind_passages

    each = kind_passages()
    assert set(each) == set(KIND_SEPARATORS) == {"prose", "code", "records"}
    assert KIND_SEPARATORS["prose"].join(each["prose"]) == builtin_corpus(PYDOC_NAME)  # the prose whole
    found = {kind: set(p) for kind, p in each.items()}
    mixed = builtin_corpus()
    order = [next(k for k, ps in found.items() if p in ps) for p in each["prose"] + each["code"] if p in mixed]
    assert order.count("prose") > 50 and order.count("code") > 50
    first = [each[kind][0] for kind in ("prose", "code", "records")]
    assert mixed.startswith("\n\n".join(first))
    more = kind_passages(record_chars=450_000)["records"]
    assert more[0].splitlines()[0] == each["records"][0].splitlines()[0] and 3 * len(each["records"]) < len(more)


def test_builtin_corpus_is_deterministic_and_read_by_the_name_a_profile_recorded():
    assert builtin_corpus() == builtin_corpus()
    text, name = load_text(None)
    assert text == builtin_corpus() and name == MIX_NAME
    assert load_text([]) == (text, name)
    # a plan profiled before the mixture still reads its prose, by the name it recorded
    assert load_text(None, builtin=PYDOC_NAME) == (builtin_corpus(PYDOC_NAME), PYDOC_NAME)
    assert load_text(None, builtin="notes.txt") == (text, name)  # a file's name is not a built-in corpus
    with pytest.raises(SensprofError, match=r"the built-in corpus 'builtin:gone' is not in this version.*re-profile"):
        builtin_corpus("builtin:gone")


# --------------------------------------------------------------------------- --text files


def test_read_plain_text(tmp_path):
    p = tmp_path / "notes.txt"
    body = "First line.\n\n{\"text\": \"not parsed in a .txt\"}\nüñí©ødé\n"
    p.write_text(body, encoding="utf-8")
    assert read_text_file(str(p)) == body


@pytest.mark.parametrize("ext", [".jsonl", ".json"])
def test_read_jsonl_text_field(tmp_path, ext):
    p = tmp_path / f"data{ext}"
    lines = [json.dumps({"text": "alpha beta", "id": 1}), "", "   ", json.dumps({"text": "gamma\ndelta"}),
             json.dumps({"meta": {"x": 1}, "text": "ε"}, ensure_ascii=False)]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_text_file(str(p)) == "alpha beta\n\ngamma\ndelta\n\nε"


def test_read_missing_file(tmp_path):
    with pytest.raises(SensprofError, match=r"does not exist; check --text") as e:
        read_text_file(str(tmp_path / "nope.txt"))
    assert "nope.txt" in str(e.value)


def test_read_invalid_json_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "ok"}\n{"text": broken\n{"text": "ok"}\n')
    with pytest.raises(SensprofError) as e:
        read_text_file(str(p))
    msg = str(e.value)
    assert f"{p}:2 is not valid JSON" in msg
    assert "one object per line" in msg


@pytest.mark.parametrize("line", ['{"content": "no text field"}', '{"text": 42}', '["text", "a list"]', '"just a str"'],
                         ids=["missing", "not-a-string", "list", "string"])
def test_read_jsonl_without_text_field(tmp_path, line):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(SensprofError) as e:
        read_text_file(str(p))
    msg = str(e.value)
    assert f"{p}:2 has no string 'text' field" in msg
    assert '{"text": ...}' in msg


def test_read_non_utf8_file(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    with pytest.raises(SensprofError, match="not UTF-8 text"):
        read_text_file(str(p))


def test_load_text_joins_files(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.jsonl"
    a.write_text("one")
    b.write_text(json.dumps({"text": "two"}) + "\n")
    text, name = load_text([str(a), str(b)])
    assert text == "one\n\ntwo"
    assert name == "a.txt,b.jsonl"


CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"


@pytest.fixture
def chat_tokenizer(tiny_tokenizer):
    """The tests' tokenizer with a simple Jinja chat template set on it (a copy: the session's has none)."""
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_a_folder_is_every_text_file_under_it_sorted(tmp_path):
    """--text FOLDER: each regular file under it in sorted path order (JSONL read as JSONL), hidden files and folders
    and binary files left out; the Text records the files actually read."""
    d = tmp_path / "docs"
    (d / "b").mkdir(parents=True)
    (d / ".git").mkdir()
    (d / "b" / "z.txt").write_text("zed")
    (d / "a.txt").write_text("alpha")
    (d / "c.jsonl").write_text(json.dumps({"text": "see"}) + "\n")
    (d / ".hidden.txt").write_text("hidden")
    (d / ".git" / "HEAD").write_text("ref")
    (d / "logo.png").write_bytes(b"\x89PNG\x00\x01")
    (d / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    text = read_texts([str(d)])
    assert text.render() == "alpha\n\nzed\n\nsee"
    assert text.files == tuple(str(d / f) for f in ("a.txt", "b/z.txt", "c.jsonl"))
    assert text.name == "docs"
    assert load_text([str(d) + "/"]) == ("alpha\n\nzed\n\nsee", "docs")


def test_a_folder_without_text_is_refused(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / ".notes").write_text("hidden")
    (d / "blob.bin").write_bytes(b"\x00\x01")
    with pytest.raises(SensprofError, match=r"--select-text .*empty is a folder with no text file in it"):
        read_texts([str(d)], "--select-text")


@pytest.mark.parametrize("body, expect", [(b"   \n\n", "is empty"), (b"text\x00\x01 more", "holds NUL bytes"),
                                          (b"\n\n", "is empty")], ids=["blank", "binary", "newlines"])
def test_every_command_refuses_an_empty_or_binary_named_file(tmp_path, body, expect):
    """The one reader refuses these for profile --text too (it once read a NUL file as text)."""
    p = tmp_path / "x.txt"
    p.write_bytes(body)
    with pytest.raises(SensprofError, match=expect):
        load_text([str(p)])


def test_a_fifo_is_refused_unopened(tmp_path):
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SensprofError, match="is not a regular file or folder"):
        read_texts([str(fifo)])
    (tmp_path / "a.txt").write_text("read")  # in a folder, skipped
    assert read_texts([str(tmp_path)]).render() == "read"


def test_chat_lines_are_rendered_with_the_models_chat_template(tmp_path, chat_tokenizer, tiny_tokenizer):
    p = tmp_path / "chats.jsonl"
    chat = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]
    p.write_text(json.dumps({"text": "plain first"}) + "\n" + json.dumps({"messages": chat}) + "\n")
    text = read_texts([str(p)])  # read and checked without a tokenizer: before the model loads
    assert text.has_chats
    assert text.render(chat_tokenizer) == "plain first\n\n<|user|>Hi there\n<|assistant|>Hello!\n"
    assert text.digest(chat_tokenizer) == text_digest(text.render(chat_tokenizer))
    assert load_text([str(p)], chat_tokenizer)[0] == text.render(chat_tokenizer)
    assert getattr(tiny_tokenizer, "chat_template", None) is None
    with pytest.raises(SensprofError) as e:
        text.render(tiny_tokenizer)
    assert f"{p}:2 is a chat ('messages'), but the model's tokenizer has no chat template" in str(e.value)


def test_a_chat_the_template_rejects_is_one_line(tmp_path, chat_tokenizer):
    chat_tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    p = tmp_path / "chats.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    with pytest.raises(SensprofError, match=rf"{p}:1: the model's chat template cannot render these messages: "
                                            "roles must alternate"):
        read_texts([str(p)]).render(chat_tokenizer)


@pytest.mark.parametrize("obj", [{"messages": []}, {"messages": "hi"}, {"messages": [{"content": "no role"}]},
                                 {"messages": [{"role": "user"}]}], ids=["empty", "string", "no-role", "no-content"])
def test_a_bad_chat_line_names_its_file_and_line(tmp_path, obj):
    p = tmp_path / "chats.jsonl"
    p.write_text(json.dumps({"text": "ok"}) + "\n\n" + json.dumps(obj) + "\n")
    with pytest.raises(SensprofError) as e:
        read_texts([str(p)])
    assert f"{p}:3 has no string 'text' field nor a 'messages' chat" in str(e.value)
    assert '{"messages": [{"role": ..., "content": ...}, ...]}' in str(e.value)


# --------------------------------------------------------------------------- make_windows

TOKENS = list(range(1000, 2000))  # token value = 1000 + position, so rows tell where they came from


def test_make_windows_shape_and_aligned_slices():
    ids, slots = make_windows(TOKENS, 10, 5, seed=3)
    assert ids.shape == (5, 10) and ids.dtype == torch.long
    assert slots == sorted(slots) and len(set(slots)) == 5
    assert all(0 <= s < 100 for s in slots)
    for row, s in zip(ids.tolist(), slots):
        assert row == TOKENS[s * 10:(s + 1) * 10]


def test_make_windows_is_deterministic_for_a_seed():
    a, sa = make_windows(TOKENS, 10, 6, seed=7)
    b, sb = make_windows(TOKENS, 10, 6, seed=7)
    assert sa == sb and torch.equal(a, b)


def test_make_windows_different_seeds_differ():
    picks = {tuple(make_windows(TOKENS, 10, 4, seed=s)[1]) for s in range(5)}
    assert len(picks) == 5
    a, _ = make_windows(TOKENS, 10, 4, seed=0)
    b, _ = make_windows(TOKENS, 10, 4, seed=1)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("seed", range(4))
def test_windows_do_not_overlap(seed):
    ids, _ = make_windows(TOKENS, 37, 20, seed=seed)  # 27 slots of 37 tokens, 20 taken
    positions = [t - 1000 for row in ids.tolist() for t in row]
    assert len(positions) == len(set(positions)) == 20 * 37
    for row in ids.tolist():  # each window is one contiguous stretch of text
        assert row == list(range(row[0], row[0] + 37))


def test_make_windows_avoids_excluded_slots():
    _, first = make_windows(TOKENS, 10, 30, seed=0)
    ids, second = make_windows(TOKENS, 10, 30, seed=0, exclude=set(first))
    assert not set(first) & set(second)
    starts = {row[0] - 1000 for row in ids.tolist()}
    assert not starts & {s * 10 for s in first}


def test_make_windows_exclude_leaves_exactly_enough():
    exclude = set(range(100)) - {4, 50, 99}
    _, slots = make_windows(TOKENS, 10, 3, seed=11, exclude=exclude)
    assert slots == [4, 50, 99]


def test_make_windows_exclude_leaves_too_few():
    with pytest.raises(SensprofError) as e:
        make_windows(TOKENS, 10, 3, seed=0, exclude=set(range(98)))
    msg = str(e.value)
    assert "2 free windows of 10 tokens but 3 were asked for" in msg
    assert "fewer --windows" in msg


def test_make_windows_with_prefix():
    ids, slots = make_windows(TOKENS, 10, 4, seed=2, prefix=[7])
    assert ids.shape == (4, 10)
    assert (ids[:, 0] == 7).all()
    for row, s in zip(ids.tolist(), slots):
        assert row[1:] == TOKENS[s * 9:(s + 1) * 9]  # the body is seq_len - len(prefix) tokens
    assert max(slots) < len(TOKENS) // 9


def test_make_windows_text_too_short():
    with pytest.raises(SensprofError) as e:
        make_windows(list(range(20)), 32, 1)
    msg = str(e.value)
    assert "the text has 20 tokens, shorter than one window of 32" in msg
    assert "longer --text" in msg and "smaller --seq-len" in msg


def test_make_windows_exactly_one_window():
    ids, slots = make_windows(list(range(32)), 32, 1)
    assert slots == [0] and ids.tolist() == [list(range(32))]


def test_make_windows_too_many_windows():
    with pytest.raises(SensprofError) as e:
        make_windows(TOKENS, 100, 11)
    msg = str(e.value)
    assert "10 free windows of 100 tokens but 11 were asked for" in msg
    assert "longer --text" in msg and "fewer --windows" in msg and "smaller --seq-len" in msg


@pytest.mark.parametrize("seq_len,prefix,least", [(1, [], 2), (0, [], 2), (2, [1, 1], 4), (3, [1, 1, 1], 5)])
def test_make_windows_seq_len_too_short(seq_len, prefix, least):
    with pytest.raises(SensprofError, match=rf"--seq-len {seq_len} is too short; use at least {least}"):
        make_windows(TOKENS, seq_len, 1, prefix=prefix)


@pytest.mark.parametrize("n", [0, -1])
def test_make_windows_needs_at_least_one_window(n):
    with pytest.raises(SensprofError, match="--windows"):
        make_windows(TOKENS, 10, n)


# --------------------------------------------------------------------------- BOS prefix


def _with_template(tiny_tokenizer, single: str):
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(tiny_tokenizer.backend_tokenizer.to_str())
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("<s>", 1), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def bos_tokenizer(tiny_tokenizer):
    return _with_template(tiny_tokenizer, "<s> $A")


def test_bos_prefix_none_for_tokenizer_without_specials(tiny_tokenizer):
    assert tiny_tokenizer("a")["input_ids"] == tiny_tokenizer("a", add_special_tokens=False)["input_ids"]
    assert bos_prefix(tiny_tokenizer) == []


def test_bos_prefix_of_llama_like_tokenizer(bos_tokenizer):
    assert bos_prefix(bos_tokenizer) == [1]


def test_bos_prefix_ignores_an_eos_suffix(tiny_tokenizer):
    assert bos_prefix(_with_template(tiny_tokenizer, "$A </s>")) == []


def test_bos_prefix_of_tokenizer_adding_bos_and_eos(tiny_tokenizer):
    assert bos_prefix(_with_template(tiny_tokenizer, "<s> $A </s>")) == [1]


# --------------------------------------------------------------------------- load_windows


def test_load_windows_builtin_shape(tiny_tokenizer):
    ids, name, digest = load_windows(tiny_tokenizer, None, 24, 3, seed=0)
    assert ids.shape == (3, 24) and ids.dtype == torch.long
    assert int(ids.min()) >= 0 and int(ids.max()) < len(tiny_tokenizer)
    assert name == MIX_NAME
    assert digest == text_digest(builtin_corpus())
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
    again, _, _ = load_windows(tiny_tokenizer, None, 24, 3, seed=0)
    assert torch.equal(ids, again)
    other, _, _ = load_windows(tiny_tokenizer, None, 24, 3, seed=1)
    assert not torch.equal(ids, other)


def test_load_windows_rows_are_text_slices(tiny_tokenizer, tmp_path):
    p = tmp_path / "t.txt"
    text = "The cat sat on the mat and then the dog ate the cat's dinner. " * 30
    p.write_text(text)
    ids, name, digest = load_windows(tiny_tokenizer, [str(p)], 16, 4, seed=5)
    assert ids.shape == (4, 16)
    assert name == "t.txt" and digest == text_digest(text)
    toks = tokenize(tiny_tokenizer, text)
    rows = {tuple(toks[s * 16:(s + 1) * 16]) for s in range(len(toks) // 16)}
    assert all(tuple(r) in rows for r in ids.tolist())


def test_load_windows_puts_bos_first(bos_tokenizer):
    ids, _, _ = load_windows(bos_tokenizer, None, 20, 3, seed=0)
    assert ids.shape == (3, 20)
    assert (ids[:, 0] == 1).all()
    assert not (ids[:, 1:] == 1).all()


def test_load_windows_exclude(tiny_tokenizer):
    toks = tokenize(tiny_tokenizer, builtin_corpus())
    _, first = make_windows(toks, 24, 3, seed=0)
    ids, _, _ = load_windows(tiny_tokenizer, None, 24, 3, seed=0, exclude=set(first))
    for row in ids.tolist():
        assert row not in [toks[s * 24:(s + 1) * 24] for s in first]


@pytest.mark.parametrize("seq_len", [1, 0, -3])
def test_load_windows_seq_len_too_short(tiny_tokenizer, seq_len):
    with pytest.raises(SensprofError, match="too short; use at least 2"):
        load_windows(tiny_tokenizer, None, seq_len, 1)


def test_load_windows_missing_file(tiny_tokenizer, tmp_path):
    with pytest.raises(SensprofError, match="does not exist"):
        load_windows(tiny_tokenizer, [str(tmp_path / "none.txt")], 16, 1)


def test_text_digest():
    assert text_digest("abc") == text_digest("abc")
    assert text_digest("abc") != text_digest("abd")
    assert re.fullmatch(r"[0-9a-f]{16}", text_digest(""))


def test_overlapping_slots_cover_every_shared_token():
    from sensprof.data import overlapping_slots

    # profiled slots of 10 tokens: [30, 40) and [70, 80); windows of 25 tokens: [25, 50) and [50, 75), [75, 100)
    assert overlapping_slots({3, 7}, 10, 25) == {1, 2, 3}
    assert overlapping_slots({3}, 10, 5) == {6, 7}  # shorter windows: both halves
    assert overlapping_slots(set(), 10, 25) == set()
    for slots, body, new in (({0, 5, 9}, 7, 30), ({2, 11}, 33, 8)):
        out = overlapping_slots(slots, body, new)
        for k in range(0, 20):
            shares = any(k * new < (s + 1) * body and s * body < (k + 1) * new for s in slots)
            assert (k in out) == shares, (slots, body, new, k)


def test_the_corpus_kinds_benchmark_summarises_profiles_cell_by_cell():
    """benchmarks/corpus_kinds.py's summary: a kind whose cells all measure twice the mixture's reads 2.00, keeps
    the ranking, and finds the mixture's best scheme wherever the order is kept; Keys over Values at 4-5 bits."""
    import os
    import runpy

    import pandas as pd

    bench = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "corpus_kinds.py"))
    cells = [("k", "int4_c32", 1e-3), ("k", "int4_c64", 2e-3), ("v", "int4_t32", 4e-3), ("v", "int5_t32", 1e-3),
             ("k", "int2_c32", 9e-3)]
    mix = pd.DataFrame([{"layer": 0, "tensor": t, "scheme": s, "bits": 4.5, "kl": kl} for t, s, kl in cells])
    double = mix.assign(kl=mix.kl * 2)
    swapped = mix.assign(kl=[2e-3, 1e-3, 4e-3, 1e-3, 9e-3])  # the two 4-bit key groups change places
    rows = {r["kind"]: r for r in bench["summarise"]({"double": double, "swapped": swapped, "mix": mix})}
    assert rows["double"]["kl_over_mix"] == pytest.approx(2.0) and rows["double"]["rank_corr_with_mix"] == 1.0
    assert rows["double"]["best_scheme_same_as_mix"] == "1/1"  # one width with two schemes: K int4
    assert rows["swapped"]["best_scheme_same_as_mix"] == "0/1" and rows["swapped"]["rank_corr_with_mix"] < 1
    assert rows["mix"]["k_over_v_4_5bits"] == pytest.approx(1.5e-3 / 2.5e-3)
