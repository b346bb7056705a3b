"""vllm/distributed/utils.py."""


def divide(numerator, denominator):
    # utils.py ensure_divisibility + divide
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def get_pp_indices(num_hidden_layers, pp_rank, pp_size):
    # utils.py:95 (without VLLM_PP_LAYER_PARTITION)
    per = num_hidden_layers // pp_size
    partitions = [per] * pp_size
    for i in range(2, num_hidden_layers % pp_size + 2):
        partitions[-i] += 1
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]
