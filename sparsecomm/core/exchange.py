"""The two contracts between a compressor's pack and the wire, framework-free, that the torch and
TF adapters implement: what a method's pack produces (`Packed`), and how it travels
(`Exchange`, one object per route of sparsecomm.core.plan in each framework's `EXCHANGES`).

Every exchange has the same phases, whatever the framework or the way in:

    start(packed, wire)       in compress: the collectives start; returns what the engine's
                              allreduce is handed, with the context `finish` needs
    advance(context, phase)   phases 0 .. advances - 1 (SparDL: 1, hierarchical: 2), run for
                              every pending tensor before any finishes, so every rank starts
                              each collective in the same order
    finish(output, context)   in decompress: the dense gradient

A DDP or FSDP bucket runs the same phases over many tensors at once (sparsecomm.torch.ddp_parts'
`BucketPart`: add, then start, advance and finish).
"""

import abc
from dataclasses import dataclass


@dataclass
class Packed:
    """What a method's pack (or dense_payload) produced: values (or 1-/2-bit codes with their
    scales), and where they belong: int32 indices, or the start of a random block. TF's ops are
    functional: its packs also give the state after them (residual, momentum); torch's update
    the state in place and leave those None. A torch pack made at fixed capacity (a DDP bucket's)
    is also `fixed`: (values, index, count), or quantized (codes, scales, index, count), its
    selection their first `count` (a 1-element int64 tensor on the device), so that an exchange can
    send it without reading the count."""

    values: object = None
    index: object = None
    start: object = None
    codes: object = None
    scales: object = None
    bits: int | None = None
    residual: object = None
    momentum: object = None
    fixed: tuple | None = None


class Exchange(abc.ABC):
    """How one packed gradient travels between compress and decompress (the phases above).
    Adding one: a subclass in sparsecomm/torch/exchange.py and sparsecomm/tensorflow/exchange.py,
    its entry in their `EXCHANGES`, and its cost in sparsecomm/core/cost.py."""

    advances = 0  # phases between start and finish

    @abc.abstractmethod
    def start(self, packed: Packed, wire):
        """Starts the exchange of `packed` (wire: the tensor's name, shape, dtype, ranks and k).
        Returns (what the engine's allreduce is handed, finish's context) in torch, a `Started`
        in TF."""

    def advance(self, context, phase: int) -> None:
        """Starts the later phase `phase` (0 .. advances - 1)."""
        raise NotImplementedError(f"{type(self).__name__} has no phase {phase} (advances={self.advances})")

    @abc.abstractmethod
    def finish(self, output, context):
        """The dense gradient, from what the engine's allreduce returned (`output`) and the context."""
