"""procs.Logged, the wait the real-vLLM tests use for processes vLLM
spawns: it lets a process that keeps printing run past any fixed time and
fails one that goes quiet, naming what it waited for."""

import sys

import pytest

from procs import Logged

TICKS = "import sys, time\nfor i in range({n}):\n    print(i, flush=True)\n    time.sleep({every})\n{then}"


def test_a_process_that_prints_runs_past_the_quiet_limit(tmp_path):
    p = Logged([sys.executable, "-c", TICKS.format(n=8, every=0.25, then="")], {}, tmp_path / "log", "ticker")
    try:
        assert p.wait("eight ticks", quiet_s=1.0) == 0  # 2 s in all, never 1 s quiet
    finally:
        p.kill()
    assert p.output().split() == [str(i) for i in range(8)]


def test_a_quiet_process_fails_naming_the_wait_and_its_output(tmp_path):
    p = Logged([sys.executable, "-c", TICKS.format(n=2, every=0.1, then="time.sleep(60)")], {}, tmp_path / "log",
               "sleeper")
    with pytest.raises(AssertionError, match=r"(?s)sleeper printed nothing for 1 s while the test waited for "
                                             r"the end; its last output:\n0\n1\n"):
        p.wait("the end", quiet_s=1.0)
    assert p.proc.poll() is not None  # killed, with its group


def test_an_exit_before_the_condition_fails_with_its_status(tmp_path):
    p = Logged([sys.executable, "-c", "print('bye'); raise SystemExit(3)"], {}, tmp_path / "log", "quitter")
    try:
        with pytest.raises(AssertionError, match=r"quitter exited with 3 while the test waited for a port"):
            p.wait_until(lambda: False, "a port", quiet_s=30)
    finally:
        p.kill()
