"""Instruments and stand-ins that real vLLM does not have; nothing else in
the fake imports from here except to count.

- disk: bytes and files the fake's safetensors reader took from disk (so a
  test can assert that a cache hit read nothing).
- hub: the "remote" Hugging Face hub is a directory, $FAKEVLLM_HUB/<org>/<name>,
  copied into the HF cache layout on download; unset, the fake is offline and
  an id that is not cached fails as huggingface_hub does offline.
- load_model / prefill_logits: what the GPU model runner does around the
  loader (gpu_model_runner.py:5409-5516 load_model under DeviceMemoryProfiler;
  execute_model for one prompt)."""

import contextlib
import os

import torch

disk = {"bytes": 0, "files": 0}


def reset_disk():
    disk["bytes"] = disk["files"] = 0


def hub_root():
    return os.environ.get("FAKEVLLM_HUB")


def load_model(vllm_config):
    """Returns (model, model_memory_usage), as a worker starts: general plugins
    first (worker_base.py:247); then, with the config current
    (gpu_worker.py:339-346), the runner gets the loader for load_config and
    loads inside a DeviceMemoryProfiler, keeping consumed_memory as the
    weights' memory, which sizes the KV cache (gpu_model_runner.py:5425-5500,
    gpu_worker.py:391)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins
    from vllm.utils.mem_utils import DeviceMemoryProfiler
    load_general_plugins()
    with set_current_vllm_config(vllm_config), DeviceMemoryProfiler() as m:
        loader = get_model_loader(vllm_config.load_config)
        model = loader.load_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
    return model, m.consumed_memory


@torch.no_grad()
def prefill_logits(model, token_ids):
    """Logits for every position of one prompt, gathered across ranks."""
    input_ids = torch.tensor(token_ids, dtype=torch.long)
    positions = torch.arange(len(token_ids))
    return model.compute_logits(model(input_ids, positions))


@contextlib.contextmanager
def as_rank(rank, world_size):
    """Within: this process is rank `rank` of a tensor-parallel group of
    world_size, for building and loading a model (each layer reads its rank
    then). No process group exists, so a forward pass with world_size > 1
    fails in its first collective; use spawn_ranks for that."""
    from vllm.distributed import parallel_state as ps
    saved = ps._WORLD, ps._TP, ps._PP
    ps._WORLD = ps._TP = ps.GroupCoordinator(range(world_size), rank)
    ps._PP = ps.GroupCoordinator([rank], rank)
    try:
        yield
    finally:
        ps._WORLD, ps._TP, ps._PP = saved


def init_from_env():
    """One rank of a tensor-parallel engine, from WORLD_SIZE, RANK and
    FAKEVLLM_INIT (a torch.distributed init method; a file:// one needs no
    port). What the worker does before building the model
    (gpu_worker.py init_worker_distributed_environment)."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    world_size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    init_distributed_environment(world_size, rank, os.environ.get("FAKEVLLM_INIT", "env://"), rank, "gloo")
    initialize_model_parallel(world_size)
    return rank, world_size


def spawn_ranks(code, world_size, workdir, timeout=300, env=None):
    """Runs `code` (Python source) in world_size processes, one per rank, with
    the fake importable and init_from_env's variables set; waits for all.
    Returns [(returncode, stdout, stderr)] by rank; a rank still running
    after timeout seconds is killed with the others, and that is an error."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = dict(os.environ, **(env or {}))
    base["PYTHONPATH"] = os.pathsep.join([here] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p])
    base["FAKEVLLM_INIT"] = "file://" + os.path.join(workdir, "dist-init")
    base["WORLD_SIZE"] = str(world_size)
    # A rank that got to the end leaves without the interpreter's teardown:
    # torch 1.13's gloo threads, still joinable when C++ statics are
    # destroyed, abort the process ("terminate called without an active
    # exception") now and then. An exception never reaches this tail.
    code += "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_sys.stderr.flush()\n_os._exit(0)\n"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=dict(base, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world_size)]
    out = []
    try:
        for rank, p in enumerate(procs):
            try:
                so, se = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"fake vLLM: rank {rank} of {world_size} still running after {timeout}s")
            out.append((p.returncode, so, se))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out
