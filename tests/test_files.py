"""The output lock (sensprof/files.py, output_lock) cannot be turned into a weapon: a planted hard link is never
truncated or written, a FIFO neither hangs the run nor is deleted; each is one line naming the fix."""

from __future__ import annotations

import os

import pytest

from sensprof.errors import SensprofError
from sensprof.files import LOCK, output_lock


def test_a_hard_link_planted_as_the_lock_is_refused_and_left_alone(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(victim, out / LOCK)
    with pytest.raises(SensprofError, match=r"is a hard link to another file.*remove it yourself, or pass another --out"):
        with output_lock(str(out)):
            pass
    assert victim.read_text() == "keep me\n" and (out / LOCK).exists()


def test_a_fifo_planted_as_the_lock_is_refused_without_hanging_or_deleting_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / LOCK)
    with pytest.raises(SensprofError, match="is not a plain file"):
        with output_lock(str(out)):
            pass
    assert (out / LOCK).exists()


def test_the_lock_is_taken_and_removed(tmp_path):
    out = tmp_path / "out"
    with output_lock(str(out)):
        assert "pid" in (out / LOCK).read_text()
    assert not out.exists()  # the folder the lock made, left empty, goes again
