"""--model-loader-extra-config for --load-format weightcache: our keys,
checked, and the rest for vLLM's DefaultModelLoader."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

LOAD_FORMAT = "weightcache"
TIERS = ("checkpoint", "processed", "auto")
MODES = ("zero_copy", "copy")

_NUM = (int, float)
_KEYS: dict[str, Any] = {"mode": str, "fallback": bool, "connect_timeout_s": _NUM, "state_timeout_s": _NUM,
                         "tier": str, "socket_dir": str, "verify_content": bool,
                         "artifacts": bool}


@dataclasses.dataclass
class Options:
    """The loader's own settings, one per key of _KEYS."""

    mode: str = "zero_copy"
    fallback: bool = True
    connect_timeout_s: float = 5.0
    state_timeout_s: float = 300.0
    tier: str = "checkpoint"
    socket_dir: Optional[str] = None
    # Files replaced or rewritten with the same headers (a re-download, a
    # touch) hit once the CRC-32C of every tensor read from them matches
    # the daemon's: the whole checkpoint is read once (the Go client's
    # --verify-content).
    verify_content: bool = False
    # vLLM's compile artifacts for this configuration restored from the
    # daemon before it compiles, and what it compiles handed to the
    # daemon (compile_cache.py).
    artifacts: bool = True


def unknown_keys_error(keys: dict[str, Any]) -> ValueError:
    """The error for extra-config keys that neither we nor vLLM's default
    loader take: it names --load-format weightcache, the format the user
    asked for, not the "auto" we hand the rest to."""
    return ValueError(f"--model-loader-extra-config for --load-format {LOAD_FORMAT}: unknown key(s) "
                      f"{', '.join(sorted(map(str, keys)))}; weightcache takes {', '.join(sorted(_KEYS))}, "
                      f"and vLLM's default loader refused the rest")


def parse_options(extra: Optional[dict[str, Any]]) -> tuple[Options, dict[str, Any]]:
    """Split --model-loader-extra-config into our Options and the keys left
    for vLLM's DefaultModelLoader, which refuses the ones it does not know
    (vLLM 0.32 default_loader.py:97-114). Wrong types and values are errors, so a typo
    cannot silently turn strict mode off."""
    extra = extra or {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config: want a JSON object, got {extra!r}")
    ours: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for k, v in extra.items():
        if k not in _KEYS:
            rest[k] = v
            continue
        want = _KEYS[k]
        if not isinstance(v, want) or (isinstance(v, bool) and want is not bool):
            raise ValueError(f"model_loader_extra_config: {k} is {v!r}, want {getattr(want, '__name__', 'a number')}")
        ours[k] = v
    o = Options(**ours)
    if o.mode not in MODES:
        raise ValueError(f"model_loader_extra_config: mode is {o.mode!r}, want zero_copy or copy")
    if o.tier not in TIERS:
        raise ValueError(f"model_loader_extra_config: tier is {o.tier!r}, want one of {', '.join(TIERS)}")
    return o, rest
