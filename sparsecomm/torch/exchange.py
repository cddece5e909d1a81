"""Exchanges for compressors whose coordinates differ per rank (top-k, threshold, DGC,
rTop-k), inside Horovod's compress/decompress contract on stock Horovod.

`compress` packs (values, indices), starts asynchronous allgathers of both (named after the
parameter, so several tensors are in flight at once and the overlap with backward is kept),
and hands Horovod a 1-element placeholder holding 1.0 for its allreduce. Horovod reduces
the placeholder with the optimizer's own op and scaling: it comes back as 1 under
op=Average (whatever gradient_predivide_factor) and as the process set's size M under
op=Sum. So `decompress` scales the sum of all ranks' contributions by output / M, the
optimizer's semantics, without being told the op.
"""
from dataclasses import dataclass

import torch

from . import ops


def to_wire(tensor):
    """Horovod 0.28.1 reduces no bfloat16 on CPU: summed bfloat16 values travel as float32 (exact)."""
    return tensor.float() if tensor.dtype == torch.bfloat16 else tensor


def _hvd():
    import horovod.torch as hvd  # imported on first use: sparsecomm.torch works without Horovod initialised
    return hvd


@dataclass
class Gathering:
    """What decompress needs: the in-flight allgathers and the tensor's shape and dtype."""
    values_handle: object
    index_handle: object
    shape: torch.Size
    dtype: torch.dtype
    values_dtype: torch.dtype
    ranks: int
    sent_elements: int
    sent_bytes: int


def start_allgather(values, index, name, shape, dtype, process_set=None):
    """Starts the allgathers of one tensor's packed values and int32 indices; returns the
    placeholder for Horovod's allreduce and the context for `finish_allgather`."""
    hvd = _hvd()
    process_set = process_set or hvd.global_process_set
    wire = values.view(torch.float16) if values.dtype == torch.bfloat16 else values  # gathered, not summed: the bits
    handles = (hvd.allgather_async(wire, name=f"sparsecomm.{name}.values", process_set=process_set),
               hvd.allgather_async(index, name=f"sparsecomm.{name}.index", process_set=process_set))
    sent = values.numel() * values.element_size() + index.numel() * index.element_size()
    placeholder = torch.ones(1, dtype=torch.float32, device=values.device)
    return placeholder, Gathering(*handles, shape, dtype, values.dtype, process_set.size(), values.numel(), sent)


def finish_allgather(output, ctx: Gathering):
    """Waits for the allgathers and returns the dense gradient: the sum of every rank's
    values at their indices (duplicates add, in rank order), scaled by output / M."""
    hvd = _hvd()
    values = hvd.synchronize(ctx.values_handle).view(ctx.values_dtype).to(ctx.dtype)  # values may be 16-bit
    index = hvd.synchronize(ctx.index_handle)
    scale = float(output.reshape(-1)[0]) / ctx.ranks
    return ops.sparse_unpack(values, index, ctx.shape.numel(), scale).view(ctx.shape)


@dataclass
class QuantizedGathering:
    """decompress's context for 1-/2-bit values: codes, scales, indices and counts in flight."""
    handles: tuple
    bits: int
    shape: torch.Size
    dtype: torch.dtype
    ranks: int
    sent_elements: int
    sent_bytes: int


def start_allgather_quantized(codes, scales, index, bits, name, shape, dtype, process_set=None):
    """Like start_allgather, for quantized values: each rank's packed codes, its scales, its
    indices and its count (to split the codes per rank) are gathered."""
    hvd = _hvd()
    process_set = process_set or hvd.global_process_set
    count = torch.tensor([index.numel()], dtype=torch.int64)
    handles = tuple(hvd.allgather_async(t, name=f"sparsecomm.{name}.{part}", process_set=process_set)
                    for part, t in (("codes", codes), ("scales", scales), ("index", index), ("count", count)))
    sent = codes.numel() + scales.numel() * 4 + index.numel() * 4 + 8
    placeholder = torch.ones(1, dtype=torch.float32, device=index.device)
    return placeholder, QuantizedGathering(handles, bits, shape, dtype, process_set.size(), index.numel(), sent)


def finish_allgather_quantized(output, ctx: QuantizedGathering):
    """Decodes every rank's codes with that rank's scales, then adds them at their indices."""
    hvd = _hvd()
    codes, scales, index, counts = (hvd.synchronize(h) for h in ctx.handles)
    per_scales = scales.numel() // len(counts)
    values, byte = [], 0
    for rank, count in enumerate(counts.tolist()):
        size = (count * ctx.bits + 7) // 8
        values.append(ops.dequantize(codes[byte:byte + size], scales[rank * per_scales:(rank + 1) * per_scales],
                                     count, ctx.bits))
        byte += size
    scale = float(output.reshape(-1)[0]) / ctx.ranks
    return ops.sparse_unpack(torch.cat(values).to(ctx.dtype), index, ctx.shape.numel(), scale).view(ctx.shape)
