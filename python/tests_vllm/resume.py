"""Runs pytest so that a test that kills its process (a native crash in an
in-process vLLM engine: SIGILL, SIGSEGV, an abort) is that test's failure
and the others still run and report: where pytest dies by a signal, the
tests not yet run are run again in a new pytest, without the one that died.

    python resume.py [pytest arguments]

A plugin (this module, loaded with -p) writes each test's outcomes to a
file as they come; the last test begun and not ended is the one the
process died in. The last line is a summary of every run together, in
pytest's words, and the exit status is pytest's, or 1 after a crash.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Optional

PROGRESS = "WC_PYTEST_PROGRESS"


# -- the plugin, in each pytest -------------------------------------------

def _note(line: str) -> None:
    path = os.environ.get(PROGRESS)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())  # on disk before whatever the test does next


def pytest_runtest_logstart(nodeid, location):
    _note("start\t" + nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _note(f"{report.outcome}\t{report.nodeid}")


def pytest_runtest_logfinish(nodeid, location):
    _note("end\t" + nodeid)


# -- the runner ------------------------------------------------------------

def _read(path: str) -> tuple[dict[str, str], Optional[str]]:
    """{nodeid: passed, failed or skipped} of the tests that ended, and the
    one begun and not ended, if any."""
    outcome: dict[str, str] = {}
    begun: Optional[str] = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            kind, _, nodeid = line.rstrip("\n").partition("\t")
            if kind == "start":
                begun = nodeid
                outcome.pop(nodeid, None)
            elif kind == "end":
                outcome.setdefault(nodeid, "passed")
                begun = None
            elif outcome.get(nodeid) != "failed":
                outcome[nodeid] = kind
    return outcome, begun


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def main(args: list[str]) -> int:
    fd, path = tempfile.mkstemp(prefix="pytest-progress-")
    os.close(fd)
    env = dict(os.environ, **{PROGRESS: path})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)), env.get("PYTHONPATH")]))
    done: dict[str, str] = {}
    crashed: dict[str, str] = {}
    try:
        while True:
            open(path, "w").close()
            skip = [a for n in sorted(done.keys() | crashed.keys()) for a in ("--deselect", n)]
            rc = subprocess.run([sys.executable, "-m", "pytest", "-p", "resume", *args, *skip], env=env).returncode
            ended, begun = _read(path)
            done.update(ended)
            if rc >= 0:
                break
            if begun is None:
                print(f"resume: pytest died by {_signal_name(rc)} outside any test; not run again", flush=True)
                rc = 1
                break
            crashed[begun] = _signal_name(rc)
            print(f"\nresume: {begun} killed pytest ({crashed[begun]}): counted failed; "
                  "the tests not run yet run in a new pytest\n", flush=True)
    finally:
        os.unlink(path)
    if not crashed:
        return rc
    for nodeid, sig in crashed.items():
        print(f"CRASHED {nodeid} - killed by {sig}")
    counts = {k: sum(1 for v in done.values() if v == k) for k in ("passed", "failed", "skipped")}
    counts["failed"] += len(crashed)
    print("= " + ", ".join(f"{n} {k}" for k, n in counts.items() if n) + f" ({len(crashed)} crashed) =", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
