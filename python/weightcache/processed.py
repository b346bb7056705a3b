"""An engine's processed weights as a daemon layout, and back.

A processed layout is every parameter and buffer of a loaded model
(persistent or not), each kept with its own strides and storage offset,
not made contiguous: post-processing leaves weights transposed, padded or
sharing storage, and the kernels rely on it. The daemon serves only
(name, dtype, shape) tensors, so each distinct storage is published as one
raw uint8 tensor, "storage.<i>", and one more uint8 tensor, INDEX, holds
JSON saying which storage, dtype, shape, strides and offset make each
name. Restoring rebuilds the same views over the daemon's bytes, so tied
weights stay one object and aliases stay aliases.

Nothing here imports vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Optional

import torch

from . import dtypes

# (name, module, attribute, kind, tensor) of a parameter or buffer.
Slot = tuple[str, torch.nn.Module, str, str, torch.Tensor]
# What restore replaced: (module, attribute, kind, tensor); kind None for a name it added.
Undo = list[tuple[torch.nn.Module, str, Optional[str], Optional[torch.Tensor]]]

INDEX = "weightcache.processed.index"
FORMAT = 1


class LayoutError(ValueError):
    """A processed layout that does not fit the model built to receive it."""


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(data_ptr, nbytes) of t's whole storage."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()
    return s.data_ptr(), s.nbytes()


def _slots(model: torch.nn.Module) -> list[Slot]:
    """(name, module, attribute, kind, tensor) for every parameter and
    buffer, persistent or not, once per name (tied ones under each name)."""
    out: list[Slot] = []
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        prefix = mod_name + "." if mod_name else ""
        for attr, p in mod._parameters.items():
            if p is not None:
                out.append((prefix + attr, mod, attr, "param", p))
        for attr, b in mod._buffers.items():
            if b is not None:
                kind = "buffer" if attr not in mod._non_persistent_buffers_set else "nonpersistent"
                out.append((prefix + attr, mod, attr, kind, b))
    return out


def capture(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, index) to publish: tensors maps "storage.<i>" and INDEX to
    uint8 tensors (the storages still on the model's device: the
    publisher copies them out); index is the decoded INDEX."""
    storages: dict[tuple[str, Optional[int], int], str] = {}
    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, dict[str, Any]] = {}
    first: dict[int, str] = {}
    for name, _, _, kind, t in _slots(model):
        if t.device.type == "meta":
            raise LayoutError(f"tensor {name} is on the meta device: nothing to publish")
        e: dict[str, Any] = {"kind": kind}
        if id(t) in first:  # the same object under another name: a tie
            e["alias"] = first[id(t)]
            entries[name] = e
            continue
        first[id(t)] = name
        ptr, nbytes = _storage(t)
        key = (t.device.type, t.device.index, ptr)
        if key not in storages:
            size = t.element_size()
            if nbytes % size:
                raise LayoutError(f"tensor {name}: storage of {nbytes} bytes is not whole {t.dtype} elements")
            sname = f"storage.{len(storages)}"
            storages[key] = sname
            whole = t.detach().as_strided((nbytes // size,), (1,), 0)
            tensors[sname] = whole.view(torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
        e.update(storage=storages[key], dtype=dtypes.from_torch(t.dtype), shape=list(t.shape),
                 stride=list(t.stride()), offset=t.storage_offset())
        entries[name] = e
    index = {"format": FORMAT, "tensors": entries}
    tensors[INDEX] = torch.frombuffer(bytearray(json.dumps(index, sort_keys=True).encode()), dtype=torch.uint8)
    return tensors, index


def read_index(weights: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The decoded INDEX of attached weights; LayoutError if absent or bad."""
    raw = weights.get(INDEX)
    if raw is None:
        raise LayoutError(f"the layout has no {INDEX}: not a processed layout")
    try:
        index = json.loads(bytes(raw.cpu().tolist()))
    except (ValueError, TypeError, RuntimeError) as e:
        raise LayoutError(f"{INDEX}: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("tensors"), dict):
        raise LayoutError(f"{INDEX}: format {index.get('format') if isinstance(index, dict) else index!r}, want {FORMAT}")
    return index


def _views(weights: Mapping[str, torch.Tensor], index: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    """name -> tensor rebuilt on device (host views stay zero-copy on cpu;
    each storage is copied to another device once, so ties survive)."""
    bases, out = {}, {}
    for name, e in index["tensors"].items():
        if "alias" in e:
            continue
        sname = e.get("storage")
        if sname not in bases:
            raw = weights.get(sname)
            if raw is None:
                raise LayoutError(f"tensor {name}: storage {sname!r} is not in the layout")
            bases[sname] = raw if raw.device == device else raw.to(device)
        try:
            typed = bases[sname].view(dtypes.to_torch(e["dtype"]))
            # as_strided's offset counts from the start of the storage,
            # which for a daemon view is the segment, not this tensor.
            out[name] = typed.as_strided(tuple(e["shape"]), tuple(e["stride"]), typed.storage_offset() + e["offset"])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise LayoutError(f"tensor {name}: cannot rebuild from {sname}: {err}") from None
    for name, e in index["tensors"].items():
        if "alias" in e:
            if e["alias"] not in out:
                raise LayoutError(f"tensor {name}: alias of {e['alias']!r}, which the layout lacks")
            out[name] = out[e["alias"]]
    return out


def restore(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], device: torch.device) -> tuple[int, Undo]:
    """Install a processed layout into model, built with its allocations on
    the meta device. The layout must name every parameter and buffer the
    model has (it may add some), each with the model's shape and dtype.
    Every name the layout has replaces the model's tensor (class and
    attributes kept, as vLLM's materialize_meta_tensor does,
    model_loader/reload/meta.py); checked before anything changes, so on
    LayoutError the model is as it was. Returns (bytes installed, undo):
    undo_restore(undo) puts the model's own tensors back."""
    index = read_index(weights)
    entries = index["tensors"]
    slots = {name: (mod, attr, kind, t) for name, mod, attr, kind, t in _slots(model)}
    # Every tensor the model has, not only those on meta: a parameter made
    # real in __init__ (torch.ones in RMSNorm) would keep its initial value.
    missing = sorted(n for n in slots if n not in entries)
    if missing:
        raise LayoutError(f"the layout lacks {len(missing)} tensors the model has, e.g. {', '.join(missing[:3])}")
    owners = {}
    for name in entries:
        mod_name, _, attr = name.rpartition(".")
        try:
            owners[name] = (model.get_submodule(mod_name) if mod_name else model, attr)
        except AttributeError:
            raise LayoutError(f"tensor {name}: the model has no module {mod_name!r}") from None
    views = _views(weights, index, device)
    for name, (_, _, _, t) in slots.items():
        v = views[name]
        if v.dtype != t.dtype or tuple(v.shape) != tuple(t.shape):
            raise LayoutError(f"tensor {name}: the layout has {dtypes.from_torch(v.dtype)} {list(v.shape)}, "
                              f"the model {dtypes.from_torch(t.dtype)} {list(t.shape)}")
    undo: Undo = [(mod, attr, kind, t) for mod, attr, kind, t in slots.values()]
    undo += [(owners[n][0], owners[n][1], None, None) for n in entries if n not in slots]
    made: dict[int, torch.Tensor] = {}  # id(view) -> installed object, so that ties stay one object
    for name, e in entries.items():
        mod, attr = owners[name]
        v = views[name]
        obj = made.get(id(v))
        if obj is None:
            old = slots.get(name, (None, None, None, None))[3]
            obj = v.detach()
            if e["kind"] == "param":
                obj = torch.nn.Parameter(obj, requires_grad=False)
            if old is not None and type(old) is not type(obj) and isinstance(old, type(obj)):
                obj.__class__ = type(old)
            if old is not None:
                obj.__dict__.update(old.__dict__)
            made[id(v)] = obj
        _install(mod, attr, e["kind"], obj)
    left = meta_tensors(model)
    if left:
        undo_restore(undo)
        raise LayoutError(f"{len(left)} tensors are still on the meta device after restore, e.g. {', '.join(left[:3])}")
    return sum(w.numel() for n, w in weights.items() if n != INDEX), undo


def _install(mod: torch.nn.Module, attr: str, kind: Optional[str], obj: Optional[torch.Tensor]) -> None:
    mod._parameters.pop(attr, None)
    mod._buffers.pop(attr, None)
    mod._non_persistent_buffers_set.discard(attr)
    if kind == "param":
        mod._parameters[attr] = obj
    elif kind is not None:
        mod._buffers[attr] = obj
        if kind == "nonpersistent":
            mod._non_persistent_buffers_set.add(attr)


def undo_restore(undo: Undo) -> None:
    """Put back what restore replaced (and drop what it added), so that a
    model whose restore or post-processing failed can be loaded afresh."""
    for mod, attr, kind, t in reversed(undo):
        _install(mod, attr, kind, t)


def shares_storage(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> bool:
    """Whether any of model's tensors are views of weights' memory (zero-copy):
    then the weights' lease must live as long as the model."""
    mine = {_storage(t)[0] for n, t in weights.items() if n != INDEX and t.numel()}
    return any(_storage(t)[0] in mine for _, _, _, _, t in _slots(model) if t.device.type != "meta" and t.numel())


def meta_tensors(model: torch.nn.Module) -> list[str]:
    """Names of parameters and buffers still on the meta device."""
    return sorted(n for n, _, _, _, t in _slots(model) if t.device.type == "meta")
