#!/usr/bin/env python3
"""Launch a vLLM server and smoke-test it with the OpenAI client."""
import argparse
import logging
import os
import subprocess
import sys
import time

import requests
from openai import OpenAI

LOG = logging.getLogger("serve")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="Qwen/Qwen2.5-VL-7B-Instruct")
    p.add_argument("--quantization", default="fp8", help="passed to vllm serve --quantization")
    p.add_argument("--port", type=int, default=8000)
    return p.parse_args()


def start(args):
    env = dict(os.environ, VLLM_MM_HASHER_ALGORITHM="blake3", VLLM_LOGGING_LEVEL="DEBUG")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", args.model, "--port", str(args.port),
           "--quantization", args.quantization,
           "--limit-mm-per-prompt", '{"image": 2}']
    LOG.info("running %s", " ".join(cmd))
    return subprocess.Popen(cmd, env=env)


def wait(port):
    for _ in range(600):
        try:
            if requests.get(f"http://localhost:{port}/health", timeout=1).ok:
                return
        except requests.ConnectionError:
            time.sleep(1)
    raise TimeoutError("vllm serve --quantization fp8 did not come up")


def smoke(port, model):
    client = OpenAI(base_url=f"http://localhost:{port}/v1", api_key="EMPTY")
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe the image."}],
        extra_body={"mm_processor_kwargs": {"max_pixels": 1280 * 28 * 28}},
    )


if __name__ == "__main__":
    a = parse_args()
    proc = start(a)
    wait(a.port)
    print(smoke(a.port, a.model))
    proc.terminate()
