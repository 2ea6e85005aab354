"""Counting host-device crossings on a machine without a GPU (scripts/host_syncs.py, tests/test_batched.py):
reads back (device to host) and uploads (host to device), as `torch.cuda.set_sync_debug_mode` sees them.

A call that reads a tensor's values on the host (`tolist`, `item`, `int()`, `float()`, `bool()`, an
index, `nonzero`, `.cpu()`, `.numpy()`) waits for the device and copies. An upload (`torch.tensor(list,
device=...)`, `.to(device)` of a tensor built on the host, or a host tensor used in a device op) is a
pageable host-to-device copy: CUDA finishes it before the call returns (a stream synchronisation
that sync debug mode reports too). Here every tensor is on the CPU, so a torch function mode tags the
tensors built on the host (factories called without a device, and what is computed from those alone)
and takes every other tensor to live on the model's device."""

from __future__ import annotations

import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy"}
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "randint", "from_numpy"}
MOVES = {"to", "cuda"}
HOST = "_specviz_built_on_host"      # the tag an emulated host tensor carries


def on_host(value) -> bool:
    return isinstance(value, torch.Tensor) and getattr(value, HOST, False)


def names_a_device(args, kwargs) -> bool:
    """Whether a `.to(...)` call moves to a device (rather than only changing the dtype)."""
    given = list(args) + [kwargs.get("device")]
    return any(isinstance(a, (torch.device, str)) or (isinstance(a, torch.Tensor)) for a in given if a is not None)


class CountCrossings(TorchFunctionMode):
    def __init__(self, where: dict | None = None):
        super().__init__()
        self.reads = self.uploads = 0
        self.where = where          # given: counts per (kind, call, the specviz line that made it)

    def note(self, kind: str, name: str) -> None:
        if self.where is None:
            return
        frame = next((f for f in traceback.extract_stack()[::-1] if "/specviz/" in f.filename), None)
        place = f"{Path(frame.filename).name}:{frame.lineno} {frame.line}" if frame else "?"
        key = (kind, name, place)
        self.where[key] = self.where.get(key, 0) + 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        host = [on_host(t) for t in tensors]
        out = func(*args, **kwargs)
        if name in FACTORIES and not any(tensors):
            if kwargs.get("device") is None:
                _tag(out)                              # built on the host
            elif name in ("tensor", "as_tensor"):
                self.uploads += 1                      # host data copied to the device
                self.note("upload", name)
        elif name in MOVES and host and host[0] and (name == "cuda" or names_a_device(args[1:], kwargs)):
            self.uploads += 1
            self.note("upload", name)
            if out is args[0]:       # .to(cpu) on this machine returns the tensor itself: a device copy is a new one
                out = out.view_as(out)
        elif name in READS:
            if host and host[0]:
                if name == "cpu":
                    _tag(out)                          # a host tensor's .cpu() is itself
            else:
                self.reads += 1
                self.note("read back", name)
        elif host and all(host):
            _tag(out)                                  # computed from host tensors alone: on the host
        elif any(h and t.dim() > 0 for h, t in zip(host, tensors)):
            self.uploads += 1                          # a host tensor used in a device op: copied first
            self.note("upload", name)
        return out


def _tag(out) -> None:
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            setattr(t, HOST, True)
