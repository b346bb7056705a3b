"""Compile artifacts on a GPU, for scripts/gpu-check.sh: real vLLM (CUDA)
with its default torch.compile, one small Llama (random weights, made
with transformers) served by a host daemon. The same start twice, each in
a process of its own with an empty compile cache (VLLM_CACHE_ROOT): the
first compiles and publishes, the second has the artifacts restored from
the daemon. Prints one JSON line: each start's seconds to ready, vLLM's
own compile figure ("torch.compile takes X s in total" where it prints
it), the plugin's artifacts lines, and whether the outputs are equal.

Usage: python3 scripts/gpu-restart.py WEIGHTCACHE_BIN WORKDIR
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "tests_vllm"))

ENGINE = textwrap.dedent("""
    import json, sys, time
    def main():
        from vllm import LLM, SamplingParams
        t0 = time.time()
        llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=128, max_num_seqs=4,
                  gpu_memory_utilization=0.3, load_format="weightcache",
                  model_loader_extra_config={"socket_dir": sys.argv[2], "fallback": False}, seed=0)
        ready = time.time() - t0
        out = llm.generate([{"prompt_token_ids": [1, 5, 9, 100, 7]}], SamplingParams(max_tokens=8, temperature=0),
                           use_tqdm=False)
        print("RESULT " + json.dumps({"ready_s": ready, "tokens": list(out[0].outputs[0].token_ids)}), flush=True)
    if __name__ == "__main__":
        main()
""")


def start(work, name, model, sock):
    root = os.path.join(work, f"{name}-cache")
    env = dict(os.environ, VLLM_CACHE_ROOT=root, TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
               VLLM_LOGGING_LEVEL="INFO", PYTHONUNBUFFERED="1")
    script = os.path.join(work, "engine.py")
    with open(script, "w") as f:
        f.write(ENGINE)
    p = subprocess.run([sys.executable, script, model, sock], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)
    with open(os.path.join(work, f"{name}.log"), "w") as f:
        f.write(p.stdout)
    res = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not res:
        raise SystemExit(f"gpu-restart: the {name} start failed (exit {p.returncode}): {p.stdout[-2000:]}")
    r = json.loads(res[-1][len("RESULT "):])
    m = re.search(r"torch\.compile takes ([\d.]+) s in total", p.stdout)
    r["vllm_compile_s"] = float(m.group(1)) if m else None
    r["artifacts"] = [ln.split("weightcache: artifacts: ", 1)[1] for ln in p.stdout.splitlines()
                      if "weightcache: artifacts: " in ln]
    return r


def main():
    wc_bin, work = sys.argv[1], sys.argv[2]
    import models
    model = models.llama(os.path.join(work, "llama"))
    sock = os.path.join(work, "restart-sock")
    os.makedirs(sock, mode=0o700, exist_ok=True)
    daemon = subprocess.Popen([wc_bin, "preload", "--model", model, "--socket-dir", sock, "--devices", "host"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if not daemon.stdout.readline():
            raise SystemExit("gpu-restart: preload exited")
        first = start(work, "first", model, sock)
        time.sleep(1)
        second = start(work, "second", model, sock)
    finally:
        daemon.terminate()
        daemon.wait()
    print(json.dumps({"first_ready_s": first["ready_s"], "second_ready_s": second["ready_s"],
                      "first_compile_s": first["vllm_compile_s"], "second_compile_s": second["vllm_compile_s"],
                      "published": any(a.startswith("published") for a in first["artifacts"]),
                      "restored": any(a.startswith("restored") for a in second["artifacts"]),
                      "identical": first["tokens"] == second["tokens"],
                      "second_artifacts": second["artifacts"]}))


if __name__ == "__main__":
    main()
