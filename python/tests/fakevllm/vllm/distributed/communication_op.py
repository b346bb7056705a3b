"""vllm/distributed/communication_op.py: collectives over the TP group."""

from .parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_):
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_, dim=-1):
    return get_tp_group().all_gather(input_, dim)


def tensor_model_parallel_gather(input_, dst=0, dim=-1):
    return get_tp_group().gather(input_, dst, dim)
