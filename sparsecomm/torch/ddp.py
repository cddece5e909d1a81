"""sparsecomm's compressors as a DistributedDataParallel communication hook, the compressor
instance being the hook's state (as PyTorch's PowerSGD hook's state is):

    compression = sct.DGC(ratio=0.001, named_parameters=model.named_parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(compression, sct.ddp_hook)

Per bucket, each parameter's gradient goes through the compressor as under Horovod (the
settings check, the route, the method's pack and its step: Compressor.prepare), and the
bucket's exchanges run over DDP's process group, one collective per kind:

  dense and shared routes   one all_reduce of their payloads, concatenated per dtype;
  allgather route           one all_gather of every rank's row counts and rows
                            (sparsecomm.core.wire), each parameter's padded to its capacity.

Each parameter's gradient is then written back into the bucket, averaged over the ranks as
DDP's own allreduce does, and the future holds the bucket's buffer. The collectives run while
DDP goes on with the backward pass; the unpack runs when the last of them has arrived.
"""

import time

import torch

from . import collectives, ops
from .exchange import Dense

# The routes this hook carries; exchange="auto" chooses among them (SparDL is not carried yet).
ROUTES = ("dense", "allgather")


def ddp_hook(compressor, bucket):
    """DDP's communication hook (``ddp.register_comm_hook(compressor, ddp_hook)``): the
    bucket's gradients compressed, exchanged over DDP's process group and averaged."""
    return BucketExchange(compressor, _attached(compressor)).start(bucket)


def _attached(compressor):
    """The compressor's torch.distributed collectives, set up on the first bucket: over the
    process group given as process_set (default: the default group)."""
    import torch.distributed as dist

    ways = compressor.collectives
    if isinstance(ways, collectives.TorchDistributed):
        return ways
    owner = compressor.method.owner
    if compressor.exchange == "spardl":
        raise ValueError(f"{owner}: exchange='spardl' does not run under ddp_hook yet; pass 'allgather' or 'auto'")
    if compressor.method.bits is not None:
        raise NotImplementedError(f"{owner}: quantize='{compressor.method.bits}bit' does not run under ddp_hook yet")
    group = compressor.process_set
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"{owner}: under ddp_hook, process_set should be a torch.distributed ProcessGroup (DDP's "
            f"process_group) or None, got {type(group).__name__}"
        )
    if compressor.planner.auto is not None:
        compressor.planner.auto.untimed(ROUTES)
    compressor.collectives = collectives.TorchDistributed(group)
    return compressor.collectives


class BucketExchange:
    """One bucket's exchange: prepared per parameter, sent per kind, written back. Every
    collective starts in the hook, in the same order on every rank (DDP calls it bucket after
    bucket); none starts in a callback, where ranks could interleave buckets differently."""

    def __init__(self, compressor, ways):
        self.compressor, self.ways = compressor, ways
        self.dense = []  # (gradient view, payload, Packed of the shared route or None)
        self.gathered = []  # (gradient view, parameter name, value dtype, row count, capacity)
        self.rows = []  # this rank's rows of each gathered parameter, as bytes

    def start(self, bucket):
        ranks = self.ways.size()
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            started = time.perf_counter()
            state, route, payload, k, _ = self.compressor.prepare(grad, self._state_of(param))
            if route == "dense":
                self.dense.append((grad, payload, None))
                traffic = Dense.traffic(payload, ranks)
            elif route == "shared":
                self.dense.append((grad, payload.values, payload))
                traffic = Dense.traffic(payload.values, ranks)
            else:
                traffic = self._add_rows(grad, state.name, payload, k)
            seconds = time.perf_counter() - started
            self.compressor.state.counters.account(
                state.name, grad.numel(), grad.numel() * grad.element_size(), *traffic, seconds
            )
        self.result = torch.futures.Future()
        reduced, gathered = self._reduce_dense(), self._gather_rows()
        started = [future for *_, future in reduced] + ([gathered[1]] if gathered else [])
        torch.futures.collect_all(started).add_done_callback(lambda _: self._finish(bucket, reduced, gathered))
        return self.result

    def _state_of(self, param):
        binding = self.compressor.state.binding
        name = binding.names.get(id(param)) if binding is not None else None
        if name is None:
            raise LookupError(
                f"{self.compressor.method.owner}: DDP's parameter of shape {list(param.shape)} is not among the "
                f"named_parameters= the compressor was given: pass the same model's named_parameters()"
            )
        return self.compressor.state.named(name)

    def _add_rows(self, grad, name, packed, k):
        """A gathered parameter's rows, padded to its capacity (Method.most_selected: k, or the top
        of a sampled threshold's band), the same on every rank: one all_gather of equal sizes then
        carries every rank's rows without a size exchange first."""
        rows = ops.wire_rows(packed.values, packed.index)
        capacity = self.compressor.method.most_selected(k, grad.numel())
        if rows.shape[0] > capacity:
            raise RuntimeError(f"sparsecomm ddp_hook: {rows.shape[0]} rows of {name!r} exceed its capacity {capacity}")
        self.gathered.append((grad, name, packed.values.dtype, rows.shape[0], capacity))
        self.rows.append(rows)
        return rows.shape[0], capacity * rows.shape[1] + 8, 0  # what travels, padding included

    def _reduce_dense(self):
        """The dense and shared payloads summed over the ranks (one all_reduce per dtype), started."""
        import torch.distributed as dist

        works = []
        for dtype in sorted({p.dtype for _, p, _ in self.dense}, key=str):
            flat = torch.cat([p.reshape(-1) for _, p, _ in self.dense if p.dtype == dtype])
            works.append((dtype, flat, dist.all_reduce(flat, group=self.ways.group, async_op=True).get_future()))
        return works

    def _gather_rows(self):
        """This rank's row counts (int64) then each parameter's rows padded to its capacity, in
        one all_gather, started: (its output, its future), or None without gathered parameters."""

        if not self.gathered:
            return None
        device = self.rows[0].device
        counts = torch.tensor([count for *_, count, _ in self.gathered], dtype=torch.int64)
        parts = [counts.to(device).view(torch.uint8)]
        for rows, (*_, capacity) in zip(self.rows, self.gathered):
            padded = torch.zeros(capacity, rows.shape[1], dtype=torch.uint8, device=device)
            padded[: rows.shape[0]] = rows
            parts.append(padded.view(-1))
        mine = torch.cat(parts)
        everyone = torch.empty(self.ways.size() * mine.numel(), dtype=torch.uint8, device=device)
        work = collectives.all_gather_into(everyone, mine, self.ways.group, async_op=True)
        return everyone.view(self.ways.size(), -1), work.get_future()

    def _finish(self, bucket, reduced, gathered):
        try:
            self._write_dense(reduced, self.ways.size())
            if gathered is not None:
                self._write_gathered(gathered[0])
            self.result.set_result(bucket.buffer())
        except Exception as error:  # DDP raises it in the backward, on this rank
            self.result.set_exception(error)

    def _write_dense(self, reduced, ranks):
        for dtype, flat, _ in reduced:
            offset = 0
            for grad, payload, packed in self.dense:
                if payload.dtype != dtype:
                    continue
                summed = flat[offset : offset + payload.numel()].view(payload.shape)
                offset += payload.numel()
                if packed is None:
                    torch.div(summed, ranks, out=grad)
                elif packed.start is not None:
                    ops.block_unpack(summed / ranks, grad.numel(), packed.start, out=grad.view(-1))
                else:
                    ops.sparse_unpack(summed / ranks, packed.index, grad.numel(), out=grad.view(-1))

    def _write_gathered(self, everyone):
        """Each parameter's rows of every rank, in rank order, unpacked into its gradient and averaged."""
        ranks, params = everyone.shape[0], len(self.gathered)
        counts = everyone[:, : 8 * params].contiguous().view(torch.int64).tolist()  # (on a GPU: one read)
        offset = 8 * params
        for i, (grad, name, value_dtype, _, capacity) in enumerate(self.gathered):
            width = 4 + torch.empty(0, dtype=value_dtype).element_size()
            block = everyone[:, offset : offset + capacity * width].reshape(ranks, capacity, width)
            offset += capacity * width
            rows = torch.cat([block[r, : counts[r][i]] for r in range(ranks)])
            ops.sparse_unpack_rows(rows, value_dtype, grad.numel(), 1.0, ranks, out=grad.view(-1))
            received = (ranks - 1) * (capacity * width + 8)
            self.compressor.state.counters.account_later(name, 0, received)
