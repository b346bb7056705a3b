"""vllm/distributed/parallel_state.py: the world, tensor-parallel and
pipeline-parallel groups. Ranks are processes; with more than one, the
collectives run over torch.distributed (gloo on CPU, where vLLM uses NCCL)."""

import torch
import torch.distributed as dist

_WORLD = None
_TP = None
_PP = None


class GroupCoordinator:
    """parallel_state.py GroupCoordinator: rank bookkeeping (:440-458) and the
    collectives all_reduce (:510), all_gather (:539), gather (:609), each a
    no-op when world_size == 1 as there."""

    def __init__(self, ranks, rank, group=None):
        self.ranks = list(ranks)
        self.rank = rank
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(rank)
        self.device_group = group

    first_rank = property(lambda self: self.ranks[0])
    last_rank = property(lambda self: self.ranks[-1])
    is_first_rank = property(lambda self: self.rank == self.first_rank)
    is_last_rank = property(lambda self: self.rank == self.last_rank)

    def all_reduce(self, input_):
        if self.world_size == 1:
            return input_
        # gloo sums half types unreliably: reduce in float32, round once.
        out = input_.float() if input_.dtype in (torch.float16, torch.bfloat16) else input_.clone()
        dist.all_reduce(out, group=self.device_group)
        return out.to(input_.dtype)

    def all_gather(self, input_, dim=-1):
        if self.world_size == 1:
            return input_
        # gloo gathers neither bfloat16 nor int16: move the bytes, which is exact.
        wire = input_.contiguous()
        if wire.dtype in (torch.float16, torch.bfloat16):
            wire = wire.view(torch.uint8)
        parts = [torch.empty_like(wire) for _ in range(self.world_size)]
        dist.all_gather(parts, wire, group=self.device_group)
        return torch.cat([p.view(input_.dtype) for p in parts], dim=dim)

    def gather(self, input_, dst=0, dim=-1):
        if self.world_size == 1:
            return input_
        out = self.all_gather(input_, dim)
        return out if self.rank_in_group == dst else None


def init_distributed_environment(world_size=-1, rank=-1, distributed_init_method="env://", local_rank=-1,
                                 backend="gloo", timeout=None):
    """parallel_state.py:1381. One process per rank; a world of one needs no
    torch.distributed (vLLM starts a group of one; nothing here reads it)."""
    global _WORLD
    if world_size == -1:
        world_size, rank = 1, 0
    if world_size > 1 and not dist.is_initialized():
        kw = {"timeout": timeout} if timeout is not None else {}
        dist.init_process_group(backend=backend, init_method=distributed_init_method, world_size=world_size,
                                rank=rank, **kw)
    if _WORLD is None:
        _WORLD = GroupCoordinator(range(world_size), rank, dist.group.WORLD if world_size > 1 else None)


def initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                              prefill_context_model_parallel_size=1, decode_context_model_parallel_size=1,
                              backend=None):
    """parallel_state.py:1517. Pipeline parallelism is not simulated: the fake's
    Llama has no intermediate-tensor hand-off, so pipeline size must be 1."""
    global _TP, _PP
    assert _WORLD is not None, "world group is not initialized"
    if pipeline_model_parallel_size != 1:
        raise NotImplementedError("fake vLLM: pipeline parallelism is not simulated")
    if _WORLD.world_size != tensor_model_parallel_size * pipeline_model_parallel_size:
        raise RuntimeError(f"world_size ({_WORLD.world_size}) is not equal to tensor_model_parallel_size "
                           f"({tensor_model_parallel_size}) x pipeline_model_parallel_size "
                           f"({pipeline_model_parallel_size})")
    _TP = GroupCoordinator(_WORLD.ranks, _WORLD.rank, _WORLD.device_group)
    _PP = GroupCoordinator([_WORLD.rank], _WORLD.rank)


def ensure_model_parallel_initialized(tensor_model_parallel_size, pipeline_model_parallel_size, backend=None):
    """parallel_state.py:1761."""
    if not model_parallel_is_initialized():
        initialize_model_parallel(tensor_model_parallel_size, pipeline_model_parallel_size)
        return
    assert get_tensor_model_parallel_world_size() == tensor_model_parallel_size, (
        "tensor parallel group already initialized, but of unexpected size: "
        f"{get_tensor_model_parallel_world_size()=} vs. {tensor_model_parallel_size=}")


def model_parallel_is_initialized():
    return _TP is not None and _PP is not None


def get_world_group():
    assert _WORLD is not None, "world group is not initialized"
    return _WORLD


def get_tp_group():
    # parallel_state.py:1248
    assert _TP is not None, "tensor model parallel group is not initialized"
    return _TP


def get_pp_group():
    # parallel_state.py:1267
    assert _PP is not None, "pipeline model parallel group is not initialized"
    return _PP


def get_tensor_model_parallel_world_size():
    # parallel_state.py:1860
    return get_tp_group().world_size


def get_tensor_model_parallel_rank():
    # parallel_state.py:1865
    return get_tp_group().rank_in_group


def destroy_model_parallel():
    global _TP, _PP
    _TP = _PP = None


def destroy_distributed_environment():
    global _WORLD
    _WORLD = None
    if dist.is_initialized():
        dist.destroy_process_group()
