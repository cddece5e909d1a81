"""How a packed gradient travels, for horovod.torch: one sparsecomm.core.exchange.Exchange per
route of sparsecomm.core.plan, in the registry EXCHANGES.

    start(packed, wire) -> (what compress hands Horovod's allreduce, context)
    advance(context, phase)   phases 0 .. advances - 1 (SparDL: 1, Hierarchical: 2)
    finish(output, context) -> the dense gradient    (in decompress)

The dense and shared routes hand Horovod the payload itself. The per-rank-coordinate exchanges
start asynchronous collectives named after the parameter (so several tensors are in flight at
once and the overlap with backward is kept) and hand Horovod a 1-element placeholder holding
1.0 (on the step of a settings check, core.placement's marker instead, whose first element is
1.0: horovod_hooks). Horovod reduces it with the optimizer's own op and scaling: it comes back
as 1 under op=Average (whatever gradient_predivide_factor) and as the process set's size M
under op=Sum. So `finish` scales the sum of all ranks' contributions by output / M, the
optimizer's semantics, without being told the op.
"""

import functools
from dataclasses import dataclass

import torch

from .. import host_sets, prerequisites
from ..core import wire as wire_format
from ..core.exchange import Exchange
from ..core.plan import SparDLLayout
from . import ops


def horovod():
    """horovod.torch, imported on first use with a clear error (sparsecomm.prerequisites)."""
    return prerequisites.horovod("torch")


def to_wire(tensor):
    """Horovod 0.28.1 reduces no bfloat16 on CPU: summed bfloat16 values travel as float32 (exact)."""
    return tensor.float() if tensor.dtype == torch.bfloat16 else tensor


@dataclass
class Wire:
    """One tensor's exchange: its parameter, shape and dtype, the process set and its number of
    ranks, the selected count k, the residual (SparDL adds what it drops there) and `out`, the
    contiguous buffer the dense result is written into (the gradient compress received: no
    allocation; a new one only for a gradient that is not contiguous; None for the dense route)."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    process_set: object
    ranks: int
    k: int = 0
    residual: torch.Tensor | None = None
    out: torch.Tensor | None = None

    def output(self):
        """The flat buffer for the result."""
        return self.out.view(-1)


@dataclass
class Context:
    """decompress's context: the exchange, the tensor's wire, this rank's byte counts, and the
    exchange's own in-flight state (`pending`)."""

    exchange: object
    wire: Wire
    sent_elements: int
    sent_bytes: int
    received_bytes: int = 0
    pending: object = None


def _placeholder(device):
    return torch.ones(1, dtype=torch.float32, device=device)


class Dense(Exchange):
    """Horovod's own allreduce of the whole tensor: compress hands it the payload itself, in its
    wire dtype (bfloat16 as float32), reduced in place."""

    def start(self, packed, wire):
        handed = to_wire(packed.values)
        return handed, Context(self, wire, *self.traffic(handed, wire.ranks))

    def finish(self, output, ctx):
        return output if output.dtype == ctx.wire.dtype else output.to(ctx.wire.dtype)

    @staticmethod
    def traffic(handed, ranks):
        """(sent elements, sent bytes, received bytes) of one rank: the payload handed to the ring,
        which receives 2 (N-1)/N of it."""
        size = handed.numel() * handed.element_size()
        return handed.numel(), size, int(2 * (ranks - 1) / ranks * size)


class Shared(Exchange):
    """Shared coordinates: the packed values ride Horovod's allreduce, no indices on the wire."""

    def start(self, packed, wire):
        values = to_wire(packed.values)
        return values, Context(self, wire, *Dense.traffic(values, wire.ranks), pending=packed)

    def finish(self, output, ctx):
        packed, numel, out = ctx.pending, ctx.wire.shape.numel(), ctx.wire.output()
        values = to_value_dtype(output, ctx.wire.dtype)
        if packed.start is not None:
            return ops.block_unpack(values, numel, packed.start, out=out).view(ctx.wire.shape)
        return ops.sparse_unpack(values, packed.index, numel, out=out).view(ctx.wire.shape)


class Allgather(Exchange):
    """Every rank's (index, value) rows, or its quantized segment (sparsecomm.core.wire), in ONE
    allgather; each rank adds all contributions, in rank order, into the result."""

    def start(self, packed, wire):
        buffer = (
            ops.wire_rows(packed.values, packed.index, 0, wire.shape.numel())
            if packed.bits is None
            else ops.quantized_segment(packed.codes, packed.scales, packed.index, packed.bits, wire.shape.numel())
        )
        handle = horovod().allgather_async(buffer, name=f"sparsecomm.{wire.name}.gather", process_set=wire.process_set)
        pending = (handle, packed.values.dtype if packed.bits is None else None, packed.bits)
        return _placeholder(buffer.device), Context(self, wire, packed.index.numel(), buffer.numel(), pending=pending)

    def finish(self, output, ctx):
        handle, value_dtype, bits = ctx.pending
        gathered = horovod().synchronize(handle)
        ctx.received_bytes = gathered.numel() - ctx.sent_bytes
        if bits is None:
            return _unpacked_rows(output, ctx, gathered, value_dtype)
        ops.sparse_unpack_segments(
            gathered, bits, ctx.wire.ranks, ctx.wire.shape.numel(), output, ctx.wire.ranks, out=ctx.wire.output()
        )
        return ctx.wire.out


def _unpacked_rows(output, ctx, rows, value_dtype):
    """Gathered wire rows (sparsecomm.core.wire) added, in rank order, into the result and scaled
    by the op, in one op; the result is the buffer `out` itself, in the gradient's shape. The op's
    scaling is Horovod's reduced placeholder (1.0 summed and scaled) over the ranks, read by the
    op where it runs: the host never reads it."""
    ops.sparse_unpack_rows(rows, value_dtype, ctx.wire.shape.numel(), output, ctx.wire.ranks, out=ctx.wire.output())
    return ctx.wire.out


# --- SparDL (Zhao et al. 2023): sparse reduce-scatter + sparse all-gather -----------------
#
# The tensor is split into N contiguous blocks; rank b owns block b (core.plan.SparDLLayout).
# Each rank packs its selection (the method's: top-k, threshold, DGC...), keeps at most
# per_rank = ceil(k / N) of its largest entries per other block and sends each block to its
# owner in ONE alltoall (the direct form of the sparse reduce-scatter: the same O(k) bytes per
# rank as the ring form, in one message step instead of N - 1). The owner adds the N
# contributions in rank order (in float32), keeps the per_rank largest sums, and the reduced
# blocks are all-gathered. Global residual collection: whatever a rank drops, from its own
# selection before sending or from the sums it owns, goes into ITS residual, so nothing is
# lost. Both phases send the (index, value) rows of sparsecomm.core.wire, values in the
# method's value dtype (the gradient's): an owner's sum is rounded to it once, and that
# rounding error is dropped into the owner's residual too.


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


# The quiet NaN of each 16-bit dtype, sign apart: what the kernels' from_float writes for any NaN.
# torch's own bfloat16 cast writes 0xFFFF, TF's keeps the sign: the canonical one gives equal bits.
_QUIET_NAN = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def to_value_dtype(values, value_dtype):
    """float32 `values` in the value dtype, a NaN as the sign-kept quiet NaN of the kernels."""
    quiet = _QUIET_NAN.get(value_dtype)
    if quiet is None or values.dtype == value_dtype:
        return values.to(value_dtype)
    rounded = values.to(value_dtype)
    nan = (((values.view(torch.int32) >> 16) & 0x8000) | quiet).to(torch.int16).view(value_dtype)
    return torch.where(values.isnan(), nan, rounded)


def _rounded(sums, index, value_dtype, residual):
    """The owner's float32 sums in the value dtype; what rounding took off goes to the residual
    (a finite sum rounded to +-inf leaves nothing there: the NaN/Inf policy of every send)."""
    rounded = to_value_dtype(sums, value_dtype)
    if residual is not None and value_dtype != torch.float32:
        error = sums - rounded.float()
        residual.index_add_(0, index.long(), torch.where(error.isfinite(), error, torch.zeros_like(error)))
    return rounded


@dataclass
class _SparDLState:
    layout: SparDLLayout
    rank: int
    handle: object
    value_dtype: torch.dtype
    own: torch.Tensor = None  # this rank's rows of the block it owns
    own_bytes: int = 0  # bytes this rank put into the gather
    gather_handle: object = None
    sets: tuple = None  # hierarchical: (the host's process set, the cross one)


def _owned_scratch(wire, size):
    """A float32 buffer for the owned block's sums: the front of the gradient buffer (consumed
    by the pack, overwritten by finish) when it is float32; a new one otherwise."""
    if wire.dtype == torch.float32:
        return wire.output()[:size]
    return torch.empty(size, dtype=torch.float32, device=wire.out.device)


def ints_on(values, dtype, device):
    """Host ints as a tensor on `device`: through pinned memory on a GPU, so that the host does
    not wait for the stream's earlier work (a copy from pageable memory would)."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def layout_ints_on(values, dtype, device):
    """ints_on for ints a bucket's layout fixes (sizes, offsets): made once and shared by every
    step, so that a step copies none of them to the device. Never write to the result."""
    return _layout_ints_on(tuple(values), dtype, device)


@functools.lru_cache(maxsize=1024)
def _layout_ints_on(values, dtype, device):
    return ints_on(values, dtype, device)


def spardl_blocks(values, index, layout, rank, residual):
    """Phase 1's choice on one rank, block by block: (owner, values, index) of its selection
    (index int32 ascending). Its own block's are kept whole, as packed; of every other block, the
    per_rank largest, in the value dtype (the rest to `residual`: global residual collection)."""
    value_dtype, flat = values.dtype, values.float()  # selection and residual in float32; exact back
    bounds = torch.searchsorted(index, layout_ints_on(layout.bounds(), torch.int32, index.device)).tolist()
    for b in range(layout.ranks):
        cut = slice(bounds[b], bounds[b + 1])
        if b == rank:
            yield b, values[cut], index[cut]
            continue
        v, i = _keep_largest(flat[cut], index[cut], layout.per_rank, residual)
        yield b, to_value_dtype(v, value_dtype), i


def spardl_split(packed, layout, rank, residual):
    """Phase 1 on one rank: its selection's wire rows for each block's owner, in block order
    (spardl_blocks' choice)."""
    blocks = spardl_blocks(packed.values, packed.index, layout, rank, residual)
    return [ops.wire_rows(v, i, *layout.owned(b)) for b, v, i in blocks]


def elements(rows, start, length):
    """The elements in a send's wire rows of [start, start + length): its rows less the markers."""
    return rows.shape[0] - wire_format.buckets(start, length)


def owner_keeps(sums, owned, low, per_rank, value_dtype, residual):
    """Phase 2's choice on the owner of the block from `low`: of its float32 sums at the indices
    that arrived (`owned`: absolute, int32, unique, ascending), the per_rank largest, rounded to
    the value dtype, in index order (the rest and the rounding to the residual): (values, owned)."""
    reduced = sums[(owned - low).long()] if owned.numel() else sums[:0]
    reduced, owned = _keep_largest(reduced, owned, per_rank, residual)
    return _rounded(reduced, owned, value_dtype, residual), owned


def spardl_reduce(parts, layout, rank, value_dtype, wire):
    """Phase 2 on the owner: the wire rows every rank sent for its block (in rank order) summed
    in float32 and owner_keeps' choice of them: the rows to all-gather."""
    values, index = ops.wire_columns(torch.cat(parts), value_dtype)
    low, size = layout.owned(rank)
    sums = ops.sparse_unpack(values.float(), index - low, size, out=_owned_scratch(wire, size))  # in rank order
    kept, owned = owner_keeps(sums, torch.unique(index), low, layout.per_rank, value_dtype, wire.residual)
    return ops.wire_rows(kept, owned, low, size)


class SparDL(Exchange):
    """Phase 1 in compress (per-block reselection, alltoall to the owners), phase 2 in
    `advance` (reduce the owned block, all-gather), phase 3 in finish."""

    advances = 1  # phases between start and finish

    def start(self, packed, wire):
        return spardl_scatter(self, packed, wire, wire.process_set)

    def advance(self, ctx, phase):
        """Waits for the scatter, reduces the owned block in rank order, keeps its per_rank
        largest sums (the rest to this rank's residual) and starts the all-gather."""
        payload = spardl_reduced(ctx)
        ctx.pending.own_bytes = payload.numel()
        ctx.pending.gather_handle = horovod().allgather_async(
            payload, name=f"sparsecomm.{ctx.wire.name}.gather", process_set=ctx.wire.process_set
        )

    def finish(self, output, ctx):
        gathered = horovod().synchronize(ctx.pending.gather_handle)
        ctx.received_bytes += gathered.numel() - ctx.pending.own_bytes
        return _unpacked_rows(output, ctx, gathered, ctx.pending.value_dtype)


def spardl_scatter(exchange, packed, wire, process_set):
    """SparDL's phase 1 over `process_set`: the selection split into one block per rank of the
    set, each block's rows sent to its owner in one alltoall. Returns (placeholder, context)."""
    layout, rank = SparDLLayout.of(wire.shape.numel(), wire.k, process_set.size()), process_set.rank()
    rows = spardl_split(packed, layout, rank, wire.residual)
    own, splits = rows[rank], [0 if b == rank else r.shape[0] for b, r in enumerate(rows)]
    pairs = sum(elements(r, *layout.owned(b)) for b, r in enumerate(rows) if b != rank)
    payload = torch.cat([r for b, r in enumerate(rows) if b != rank] or [rows[rank][:0]])
    handle = horovod().alltoall_async(
        payload,
        splits=torch.tensor(splits, dtype=torch.int32),
        name=f"sparsecomm.{wire.name}.scatter",
        process_set=process_set,
    )
    state = _SparDLState(layout, rank, handle, packed.values.dtype, own)
    return _placeholder(payload.device), Context(exchange, wire, pairs, payload.numel(), pending=state)


def spardl_reduced(ctx):
    """SparDL's phase 2: waits for the scatter and returns the owned block's reduced rows (what
    was dropped or rounded off went to this rank's residual), counted as sent."""
    st = ctx.pending
    received, splits = horovod().synchronize(st.handle)
    ctx.received_bytes += received.numel()
    parts = list(received.split(splits.tolist()))
    parts[st.rank] = st.own
    payload = spardl_reduce(parts, st.layout, st.rank, st.value_dtype, ctx.wire)
    ctx.sent_elements += elements(payload, *st.layout.owned(st.rank))
    ctx.sent_bytes += payload.numel()
    st.own = None
    return payload


class Hierarchical(Exchange):
    """Dense inside a host, sparse between hosts: SparDL over the host's ranks (each owns 1/R of
    the tensor and keeps ceil(k/R) of the host's sums there, so the host keeps k), the owned rows
    all-gathered across the hosts (the ranks of the same local rank: only the host's k pairs
    cross its NIC), then all-gathered inside the host. What a rank drops or rounds off goes to
    its own residual, as in SparDL. Phases: start, advance 0 and 1, finish."""

    advances = 2

    def start(self, packed, wire):
        local, cross = host_sets.registered(horovod(), wire.ranks)
        placeholder, ctx = spardl_scatter(self, packed, wire, local)
        ctx.pending.sets = (local, cross)
        return placeholder, ctx

    def advance(self, ctx, phase):
        """Phase 0: the host's reduced rows of this rank's block to the other hosts; phase 1: the
        hosts' rows of this block to the other ranks of the host."""
        st, local, cross = ctx.pending, *ctx.pending.sets
        if phase == 0:
            payload, process_set, name = spardl_reduced(ctx), cross, "cross"
        else:
            payload, process_set, name = horovod().synchronize(st.gather_handle), local, "host"
            ctx.received_bytes += payload.numel() - st.own_bytes
            ctx.sent_bytes += payload.numel()
        st.own_bytes = payload.numel()
        st.gather_handle = horovod().allgather_async(
            payload, name=f"sparsecomm.{ctx.wire.name}.{name}", process_set=process_set
        )

    finish = SparDL.finish


EXCHANGES = {
    "dense": Dense(),
    "shared": Shared(),
    "allgather": Allgather(),
    "spardl": SparDL(),
    "hierarchical": Hierarchical(),
}


class InFlight:
    """The exchanges of one compressor between compress and decompress: started by route, and
    finished with the phases every rank must start in the same order advanced first."""

    def __init__(self):
        self.pending = []  # contexts of exchanges started that still have a phase to advance

    def start(self, route, payload, tensor, state, k, process_set, ranks):
        """(what Horovod reduces, the context of decompress, the traffic compress counts)."""
        # The pack consumed the gradient: the result is written there (a copy only if it is strided).
        out = None
        if route != "dense":
            out = tensor if tensor.is_contiguous() else torch.empty_like(tensor, memory_format=torch.contiguous_format)
        wire = Wire(state.name, tensor.shape, tensor.dtype, process_set, ranks, k, state.residual, out)
        handed, ctx = EXCHANGES[route].start(payload, wire)
        if ctx.exchange.advances:
            self.pending.append(ctx)
        return handed, ctx, (ctx.sent_elements, ctx.sent_bytes, ctx.received_bytes)

    def finish(self, output, ctx, account_later):
        """The dense gradient; account_later(name, sent_bytes, received_bytes) counts what moved here."""
        if ctx.exchange.advances:
            self._advance_pending(account_later)
        received_before = ctx.received_bytes  # what compress already counted (a dense allreduce's)
        result = ctx.exchange.finish(output, ctx)
        if ctx.received_bytes != received_before:
            account_later(ctx.wire.name, 0, ctx.received_bytes - received_before)
        return result

    def _advance_pending(self, account_later):
        """Every pending exchange advanced before any is finished, phase by phase: every rank has
        started all of them, whatever order Horovod decompresses in."""
        for phase in range(max((p.exchange.advances for p in self.pending), default=0)):
            for pending in self.pending:
                if phase < pending.exchange.advances:
                    sent_before, received_before = pending.sent_bytes, pending.received_bytes
                    pending.exchange.advance(pending, phase)
                    account_later(
                        pending.wire.name, pending.sent_bytes - sent_before, pending.received_bytes - received_before
                    )
        self.pending = []

    def drop(self):
        """After an elastic reset: exchanges in flight when a worker failed never finish."""
        self.pending = []
