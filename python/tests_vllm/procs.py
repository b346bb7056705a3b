"""Processes the real-vLLM tests start (vLLM's own spawned engines,
`vllm serve`), waited for by their progress rather than by a wall clock a
loaded machine can exceed on a correct run: a wait fails when the process
exits first or has printed nothing for QUIET_S seconds, and says what it
waited for with the process's last output."""

import json
import os
import signal
import subprocess
import sys
import time

# vLLM logs each step of an engine start at INFO (VLLM_LOGGING_LEVEL is
# set so): five minutes without a line is a process that is stuck.
QUIET_S = float(os.environ.get("WC_TEST_QUIET_S", "300"))


class Logged:
    """cmd running in its own process group, stdout and stderr in path."""

    def __init__(self, cmd, env, path, name):
        self.name, self.path = name, str(path)
        self._log = open(self.path, "w+")
        env = dict(env, VLLM_LOGGING_LEVEL="INFO", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def output(self):
        with open(self.path, errors="replace") as f:
            return f.read()

    def _tail(self):
        return self.output()[-4000:]

    def wait_until(self, cond, what, quiet_s=QUIET_S):
        """Returns once cond() is true."""
        size, moved = -1, time.monotonic()
        while not cond():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode} while the test waited for "
                                     f"{what}; its last output:\n{self._tail()}")
            n = os.fstat(self._log.fileno()).st_size
            if n != size:
                size, moved = n, time.monotonic()
            elif time.monotonic() - moved > quiet_s:
                raise AssertionError(f"{self.name} printed nothing for {quiet_s:.0f} s while the test waited for "
                                     f"{what}; its last output:\n{self._tail()}")
            time.sleep(0.2)

    def wait(self, what, quiet_s=QUIET_S):
        """The exit status, once the process ended by itself."""
        try:
            self.wait_until(lambda: self.proc.poll() is not None, what, quiet_s)
        except AssertionError:
            self.kill()
            raise
        return self.proc.returncode

    def stop(self, grace_s=60):
        """SIGINT, as Ctrl-C stops vLLM, then SIGKILL to the whole group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # vLLM's engine core and workers with it
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log.close()


def run_script(script, env, log, name, what):
    """Runs the Python script (which prints its findings as one line
    "RESULT <json>") in a process of its own until it exits, as Logged
    waits; returns the findings, or fails with its output."""
    p = Logged([sys.executable, str(script)], env, log, name)
    try:
        rc = p.wait(what)
    finally:
        p.kill()
    lines = [ln for ln in p.output().splitlines() if ln.startswith("RESULT ")]
    assert rc == 0 and lines, p.output()[-4000:]
    return json.loads(lines[-1][len("RESULT "):])
