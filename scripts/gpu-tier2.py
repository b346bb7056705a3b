"""Tier 2 on a GPU, for scripts/gpu-check.sh: the vLLM loader over the fake
vLLM's model classes (python/tests/fakevllm: a GPU host may have CUDA torch
but no vLLM) with the model built on DEVICE. The first start loads tier 1
from the host daemon and publishes its processed weights into DEVICE's own
publish-only daemon; the restart maps them there, zero-copy: no
host-to-device copy, no disk read. Prints one JSON line: restart seconds of
auto, tier 1 and the tier-2 hit, the bytes the CUDA allocator gained for
the weights on each, and whether the logits are identical.

Usage: python3 scripts/gpu-tier2.py MODEL SOCKET_DIR DEVICE
(DEVICE cpu runs the same steps on host daemons, a dry run without a GPU.)
"""

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "python", "tests", "fakevllm")]

import torch  # noqa: E402

PROMPT = [1, 5, 9, 100, 7, 300, 2, 64]


def main():
    model, sock, device = sys.argv[1], sys.argv[2], sys.argv[3]
    import weightcache.vllm as plugin
    from vllm import _fake
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, VllmConfig
    assert plugin.register()
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)

    def start(fmt, **extra):
        cfg = VllmConfig(model_config=ModelConfig(model=model), device_config=DeviceConfig(device=device),
                         load_config=LoadConfig(load_format=fmt, model_loader_extra_config=dict(extra)))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
        t = time.perf_counter()
        with _fake.as_rank(0, 1):
            m, mem = _fake.load_model(cfg)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            s = time.perf_counter() - t
            logits = _fake.prefill_logits(m, PROMPT).float().cpu()
        gained = (torch.cuda.memory_allocated(dev) - before) if dev.type == "cuda" else mem
        on = {p.device.type for p in m.parameters()}
        return m, logits, s, gained, on

    _, want, auto_s, auto_b, _ = start("auto")
    _, t1, t1_s, t1_b, _ = start("weightcache", socket_dir=sock, fallback=False)
    start("weightcache", socket_dir=sock, fallback=False, tier="processed")  # publishes
    m, t2, t2_s, t2_b, on = start("weightcache", socket_dir=sock, fallback=False, tier="processed")
    print(json.dumps({"auto_s": auto_s, "tier1_s": t1_s, "tier2_s": t2_s, "auto_bytes": auto_b, "tier1_bytes": t1_b,
                      "tier2_bytes": t2_b, "identical": bool(torch.equal(want, t1) and torch.equal(want, t2)),
                      "tier2_lease": hasattr(m, "_weightcache_lease"), "devices": sorted(on)}, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
