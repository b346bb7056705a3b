"""Fill a module built on the meta device with tensors, without copying."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import torch

# Tied weights HF checkpoints often leave out: (absent name, its source).
DEFAULT_ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}


class MaterializeError(ValueError):
    """Names that did not fit: .missing, .unexpected, .wrong_shape."""

    def __init__(self, missing: list[str], unexpected: list[str],
                 wrong_shape: list[tuple[str, Sequence[int], Sequence[int]]]) -> None:
        parts = []
        if missing:
            parts.append("missing: " + ", ".join(missing))
        if unexpected:
            parts.append("unexpected: " + ", ".join(unexpected))
        if wrong_shape:
            parts.append("wrongly shaped: " + ", ".join(f"{n} (module {tuple(m)}, tensor {tuple(t)})" for n, m, t in wrong_shape))
        super().__init__("materialize: " + "; ".join(parts))
        self.missing, self.unexpected, self.wrong_shape = missing, unexpected, wrong_shape


def _slots(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str, bool, torch.Tensor]]:
    """(qualified name, owning module, attribute, is_parameter, current) for
    every parameter and buffer; tied ones appear once per name."""
    out = []
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = mod_name + "." if mod_name else ""
        for attr, p in mod._parameters.items():
            if p is not None:
                out.append((prefix + attr, mod, attr, True, p))
        for attr, b in mod._buffers.items():
            if b is not None and attr not in mod._non_persistent_buffers_set:
                out.append((prefix + attr, mod, attr, False, b))
    return out


def materialize(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
                aliases: Optional[Mapping[str, str]] = None, check_shapes: bool = True) -> torch.nn.Module:
    """Install tensors (name -> tensor) as module's parameters and buffers.

    Parameters become requires_grad=False Parameters sharing the tensors'
    memory (copy-on-write host views stay so, read-only GPU views too). Names tied in the module (the
    same Parameter under two names, e.g. lm_head.weight and
    model.embed_tokens.weight) stay tied: the tensor given for either name
    fills both. aliases maps a name absent from tensors to the name that
    provides it (default: lm_head.weight -> model.embed_tokens.weight).
    check_shapes=False accepts shapes that differ from the module's, for
    layouts an engine reshaped after loading.

    Raises MaterializeError listing every missing, unexpected and wrongly
    shaped name; the module is not modified then.
    """
    aliases = DEFAULT_ALIASES if aliases is None else aliases
    slots = _slots(module)
    groups: dict[int, list[str]] = {}  # id(original) -> names sharing it
    for name, _, _, _, cur in slots:
        groups.setdefault(id(cur), []).append(name)
    plan, missing, wrong = {}, [], []
    used: set[str] = set()
    for name, mod, attr, is_param, cur in slots:
        # Every name of a tied group takes the same source, so the group
        # stays one Parameter.
        group = groups[id(cur)]
        cands = group + [aliases[n] for n in group if n in aliases]
        src = next((c for c in cands if c in tensors), None)
        if src is None:
            missing.append(name)
            continue
        used.update(c for c in group if c in tensors)
        used.add(src)
        t = tensors[src]
        if check_shapes and tuple(t.shape) != tuple(cur.shape):
            wrong.append((name, cur.shape, t.shape))
            continue
        plan[name] = (mod, attr, is_param, cur, src)
    unexpected = sorted(n for n in tensors if n not in used)
    if missing or unexpected or wrong:
        raise MaterializeError(sorted(missing), unexpected, wrong)
    made = {}  # one Parameter per (original, source), so ties survive
    for name, (mod, attr, is_param, cur, src) in plan.items():
        key = (id(cur), src)
        if key not in made:
            t = tensors[src]
            made[key] = torch.nn.Parameter(t, requires_grad=False) if is_param else t
        if is_param:
            mod._parameters[attr] = made[key]
        else:
            mod._buffers[attr] = made[key]
    _retie(module, tensors, aliases)
    return module


def _retie(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor], aliases: Mapping[str, str]) -> None:
    """Tie an alias to its source when the module holds them separately but
    the tensors provided only the source (the checkpoint dropped the tied
    copy): both names must then be one Parameter, as tie_weights makes them."""
    slots = {name: (mod, attr, cur) for name, mod, attr, is_param, cur in _slots(module) if is_param}
    for name, src in aliases.items():
        if name in slots and src in slots and name not in tensors and slots[name][2] is not slots[src][2]:
            mod, attr, _ = slots[name]
            mod._parameters[attr] = slots[src][2]
