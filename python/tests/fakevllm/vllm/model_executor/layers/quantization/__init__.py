"""vllm/model_executor/layers/quantization/__init__.py: the fake knows one
method, fp8 (quantization/fp8.py)."""

QUANTIZATION_METHODS = ["fp8"]


def get_quantization_config(quantization):
    # quantization/__init__.py:155
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"Invalid quantization method: {quantization}")
    from .fp8 import Fp8Config
    return {"fp8": Fp8Config}[quantization]
