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


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_note(tmp_path, capsys):
    """A lock file whose holder is gone (kill -9 runs no clean-up) is locked again in place, with a note."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text("pid 999999999: sensprof export plan.json --write-checkpoint out\n")
    with output_lock(str(out)):
        assert f"pid {os.getpid()}" in (out / LOCK).read_text()
    err = capsys.readouterr().err
    assert "note: taking over" in err and "no longer running" in err and "pid 999999999" in err
    assert not (out / LOCK).exists()


def test_a_lock_held_by_a_live_run_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom sensprof.files import output_lock\n"
                               f"with output_lock({str(out)!r}):\n    print('held', flush=True)\n    sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SensprofError) as e:
            with output_lock(str(out)):
                pass
        assert "\n" not in str(e.value) and f"pid {holder.pid}" in str(e.value) and "pass another --out" in str(e.value)
    finally:
        holder.communicate("", timeout=30)
    assert not (out / LOCK).exists()
