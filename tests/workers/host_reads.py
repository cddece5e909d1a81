"""Recorders of the host's reads of tensor data made by sparsecomm's Python (item, float(),
int(), bool(), tolist, numpy), for the tests that count them: HostReads (a TorchFunctionMode: the
calling thread only; the Horovod worker torch_host_reads.py) and patched_reads (every thread: a
DDP hook's callbacks run in the collectives' threads)."""

import contextlib
import os
import traceback

import torch
from torch.overrides import TorchFunctionMode

import sparsecomm

READS = {"item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "__array__"}
PACKAGE = os.path.dirname(os.path.abspath(sparsecomm.__file__)) + os.sep


def _where():
    """The innermost sparsecomm function on this thread's stack, as "file:function" ("outside": none)."""
    frames = [f for f in traceback.extract_stack() if os.path.abspath(f.filename).startswith(PACKAGE)]
    return f"{os.path.abspath(frames[-1].filename)[len(PACKAGE) :]}:{frames[-1].name}" if frames else "outside"


class HostReads(TorchFunctionMode):
    """Records each read of a tensor's data on the host, and where in sparsecomm it came from."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in READS:
            self.reads.append((name, _where()))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def patched_reads():
    """Yields the list of (read, "file:function") of the reads sparsecomm's Python makes inside the
    block, in any thread: torch.Tensor's reading methods are wrapped while it lasts."""
    reads, originals = [], {name: getattr(torch.Tensor, name) for name in READS}

    def wrapped(name, original):
        def read(self, *args, **kwargs):
            where = _where()
            if where != "outside":
                reads.append((name, where))
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrapped(name, original))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
