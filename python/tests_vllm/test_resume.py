"""resume.py, the runner of the real-vLLM suite: a test that kills the
pytest process is that test's failure, and the tests after it still run
and report."""

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

TESTS = textwrap.dedent("""
    import os, signal

    def test_a():
        pass

    def test_b_dies():
        os.kill(os.getpid(), signal.SIGILL)

    def test_c():
        pass

    def test_d_fails():
        assert False

    def test_e_dies_too():
        os.kill(os.getpid(), signal.SIGSEGV)

    def test_f():
        pass
""")


def test_a_crash_is_that_tests_failure_and_the_rest_report(tmp_path):
    (tmp_path / "test_crash.py").write_text(TESTS)
    r = subprocess.run([sys.executable, os.path.join(HERE, "resume.py"), "-q", "-p", "no:cacheprovider",
                        "-p", "no:faulthandler", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    crashed = sorted(ln for ln in r.stdout.splitlines() if ln.startswith("CRASHED "))
    assert crashed == ["CRASHED test_crash.py::test_b_dies - killed by SIGILL",
                       "CRASHED test_crash.py::test_e_dies_too - killed by SIGSEGV"], out
    assert r.stdout.splitlines()[-1] == "= 3 passed, 3 failed (2 crashed) =", out
