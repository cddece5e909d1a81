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
    received_bytes: int = 0


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
    values = hvd.synchronize(ctx.values_handle).view(ctx.values_dtype)
    index = hvd.synchronize(ctx.index_handle)
    ctx.received_bytes = (values.numel() - ctx.sent_elements) * (values.element_size() + 4)
    values = values.to(ctx.dtype)  # values may travel in 16 bits
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
    received_bytes: int = 0


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
    ctx.received_bytes = codes.numel() + scales.numel() * 4 + index.numel() * 4 + counts.numel() * 8 - ctx.sent_bytes
    per_scales = scales.numel() // len(counts)
    values, byte = [], 0
    for rank, count in enumerate(counts.tolist()):
        size = (count * ctx.bits + 7) // 8
        values.append(ops.dequantize(codes[byte:byte + size], scales[rank * per_scales:(rank + 1) * per_scales],
                                     count, ctx.bits))
        byte += size
    scale = float(output.reshape(-1)[0]) / ctx.ranks
    return ops.sparse_unpack(torch.cat(values).to(ctx.dtype), index, ctx.shape.numel(), scale).view(ctx.shape)


# --- SparDL (Zhao et al. 2023): sparse reduce-scatter + sparse all-gather -----------------
#
# The tensor is split into N contiguous blocks; rank b owns block b. Each rank packs its
# selection (the method's: top-k, threshold, DGC...), keeps at most kb = ceil(k / N) of its
# largest entries per other block and sends each block to its owner in ONE alltoall (the
# direct form of the sparse reduce-scatter: the same O(k) bytes per rank as the ring form,
# in one message step instead of N - 1). The owner adds the N contributions in rank order,
# keeps the kb largest sums, and the reduced blocks are all-gathered (kb pairs per rank).
# Global residual collection: whatever a rank drops, from its own selection before sending
# or from the sums it owns, goes into ITS residual, so nothing is lost. Pairs travel as
# int32 rows (float32 value bits, index): 8 bytes each.


def _pairs(values, index):
    return torch.stack([values.float().view(torch.int32), index], 1)


def _unpair(rows):
    rows = rows.reshape(-1, 2)
    return rows[:, 0].contiguous().view(torch.float32), rows[:, 1].contiguous()


def _keep_largest(values, index, k, residual):
    """The k entries of largest |value| (ties: lower index), in index order; the rest are
    added to the residual (global residual collection)."""
    if index.numel() <= k:
        return values, index
    kept_values, kept_index = ops.select_top(values, index, k)
    if residual is not None:
        dropped = ~torch.isin(index, kept_index)
        residual.index_add_(0, index[dropped].long(), values[dropped])
    return kept_values, kept_index


@dataclass
class SparDL:
    """decompress's context: the scatter in flight, then (after `advance`) the gather."""
    handle: object
    own_values: torch.Tensor
    own_index: torch.Tensor
    residual: object
    block: int
    per_rank: int
    rank: int
    ranks: int
    name: str
    shape: torch.Size
    dtype: torch.dtype
    process_set: object
    sent_elements: int
    sent_bytes: int
    received_bytes: int = 0
    gather_handle: object = None


def start_spardl(values, index, residual, k, name, shape, dtype, process_set=None):
    """Phase 1 (in compress): per-block reselection and the alltoall to the block owners."""
    hvd = _hvd()
    process_set = process_set or hvd.global_process_set
    ranks, rank = process_set.size(), process_set.rank()
    block = -(-shape.numel() // ranks)
    per_rank = max(1, -(-k // ranks))
    values = values.float()
    bounds = torch.searchsorted(index, torch.arange(ranks + 1, dtype=torch.int64).mul_(block).clamp_(max=2**31 - 1)
                                .to(torch.int32)).tolist()
    rows, splits, own = [], [], None
    for b in range(ranks):
        v, i = values[bounds[b]:bounds[b + 1]], index[bounds[b]:bounds[b + 1]]
        if b == rank:
            own, count = (v, i), 0
        else:
            v, i = _keep_largest(v, i, per_rank, residual)
            rows.append(_pairs(v, i))
            count = i.numel()
        splits.append(count)
    payload = torch.cat(rows) if rows else torch.empty(0, 2, dtype=torch.int32)
    handle = hvd.alltoall_async(payload, splits=torch.tensor(splits, dtype=torch.int32),
                                name=f"sparsecomm.{name}.scatter", process_set=process_set)
    return SparDL(handle, own[0], own[1], residual, block, per_rank, rank, ranks, name, shape, dtype, process_set,
                  payload.shape[0], payload.numel() * 4)


def advance_spardl(ctx: SparDL):
    """Phase 2: waits for the scatter, reduces the owned block in rank order, keeps its
    per_rank largest sums (the rest to this rank's residual) and starts the all-gather."""
    hvd = _hvd()
    received, splits = hvd.synchronize(ctx.handle)
    ctx.received_bytes += received.numel() * 4
    parts = list(received.reshape(-1, 2).split(splits.tolist()))
    parts[ctx.rank] = _pairs(ctx.own_values, ctx.own_index)
    values, index = _unpair(torch.cat(parts))
    low = ctx.rank * ctx.block
    size = max(0, min(ctx.block, ctx.shape.numel() - low))
    sums = ops.sparse_unpack(values, index - low, size)  # float32, added in rank order
    owned = torch.unique(index)
    reduced = sums[(owned - low).long()] if owned.numel() else sums[:0]
    reduced, owned = _keep_largest(reduced, owned, ctx.per_rank, ctx.residual)
    payload = _pairs(reduced, owned)
    ctx.sent_elements += payload.shape[0]
    ctx.sent_bytes += payload.numel() * 4
    ctx.own_values = ctx.own_index = None
    ctx.gather_handle = hvd.allgather_async(payload, name=f"sparsecomm.{ctx.name}.gather",
                                            process_set=ctx.process_set)
    ctx.handle = payload.shape[0]  # this rank's own share of the gather, for the byte count


def finish_spardl(output, ctx: SparDL):
    """Phase 3 (in decompress): the gathered blocks, scaled by output / M."""
    hvd = _hvd()
    gathered = hvd.synchronize(ctx.gather_handle)
    ctx.received_bytes += (gathered.shape[0] - ctx.handle) * 8
    values, index = _unpair(gathered)
    scale = float(output.reshape(-1)[0]) / ctx.ranks
    return ops.sparse_unpack(values, index, ctx.shape.numel(), scale).to(ctx.dtype).view(ctx.shape)


def measure_network(process_set=None):
    """Measures this cluster for exchange="auto" (once): latency from 1-element allreduces,
    bandwidth from 4 MB ones, copy bandwidth from a local copy; averaged over the ranks so
    every rank makes the same choices."""
    from .. import _cost
    hvd = _hvd()
    process_set = process_set or hvd.global_process_set
    ranks = process_set.size()

    small, big = torch.zeros(1), torch.zeros(1 << 20)
    counter = iter(range(1 << 30))
    reduce = lambda t: hvd.allreduce(t, name=f"sparsecomm.measure.{next(counter)}", process_set=process_set)  # noqa: E731
    reduce(small)
    t_small, t_big = _cost.median_seconds(lambda: reduce(small), 5), _cost.median_seconds(lambda: reduce(big), 3)
    t_copy = _cost.median_seconds(lambda: big.clone(), 3)
    measured = _cost.from_timings(ranks, t_small, t_big, big.numel() * 4, t_copy)
    mean = hvd.allreduce(torch.tensor(measured, dtype=torch.float64), name="sparsecomm.measure.mean",
                         process_set=process_set)
    return _cost.Network(bandwidth=float(mean[1]), latency=float(mean[0]), copy_bandwidth=float(mean[2]))
