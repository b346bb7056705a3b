"""A vLLM model loader: --load-format weightcache.

Tier 1 (tier "checkpoint", the default): the loader is vLLM's
DefaultModelLoader with one change, the weights iterator. It yields the
checkpoint's tensors, as stored, from the node's host daemon
(`weightcache preload --model M --devices host`) instead of reading the
files; vLLM builds the model on its device and runs model.load_weights
(fused qkv/gate_up, tensor-parallel slicing, quantization) and
process_weights_after_loading as always. Every rank of every engine on the
node attaches to that one daemon with the checkpoint's own layout (tp 1,
rank 0); slicing is vLLM's. Nothing model-specific is ours.

Tier 2 (tier "processed", or "auto" where safe): the first start loads as
tier 1 and publishes every parameter and buffer of its rank into that
rank's publish-only host daemon; a restart builds the model once with its
bare allocations on the meta device and fills it from the daemon, skipping
post-processing.

Every start says in vLLM's own log, in one line, whether it hit
("weightcache: hit, N tensors, M MiB in S s from SOCKET") or missed
("weightcache: fallback: REASON; loading from disk"): the logger is
"vllm.weightcache", a child of the "vllm" logger that vLLM configures
(vllm/logger.py DEFAULT_LOGGING_CONFIG); one of our own would reach no
handler under vLLM. Any miss loads through vLLM's own loader from disk.
No error of ours reaches vLLM unless fallback is false.

The modules, as vLLM's own model_loader is laid out: options (the extra
config), safety (what makes a tier unsafe or the daemon unfit), engine
(the rank, device and settings read from vLLM's config), api (the one
adapter to vLLM's names), tier1 and tier2, and loader (the one class).
vLLM is imported only inside register() and the loader: this package
imports without vLLM.
"""

from __future__ import annotations

import logging

from .api import VllmAPI
from .engine import ENGINE, Rank, engine_config, processed_key
from .options import LOAD_FORMAT, TIERS, Options, parse_options, unknown_keys_error
from .safety import unsafe_for_processed
from .inplace import WORKER_EXTENSION, SwitchFailed, SwitchRefused, Switched, WorkerExtension, switch, switch_server
from .tier2 import BareOnMeta

__all__ = ["register", "LOAD_FORMAT", "ENGINE", "TIERS", "Options", "parse_options", "unknown_keys_error",
           "unsafe_for_processed", "Rank", "processed_key", "engine_config", "VllmAPI", "BareOnMeta",
           "switch", "switch_server", "Switched", "SwitchRefused", "SwitchFailed", "WorkerExtension", "WORKER_EXTENSION"]

log = logging.getLogger("vllm.weightcache")


def register() -> bool:
    """The vllm.general_plugins entry point: make --load-format weightcache
    known. Never raises: a broken plugin must not stop vLLM starting (an
    engine that asks for weightcache then fails on an unknown format)."""
    try:
        api = VllmAPI()
        from .loader import WeightcacheModelLoader
        WeightcacheModelLoader.api = api
        api.register_model_loader(LOAD_FORMAT)(WeightcacheModelLoader)
    except Exception as e:
        log.error("weightcache: --load-format %s not registered: %s: %s", LOAD_FORMAT, type(e).__name__, e)
        return False
    # As vLLM starts, before it inspects the model: its model info cache
    # from the daemon (compile_cache.py).
    from .compile_cache import restore_engine_files
    restore_engine_files(api)
    return True
