"""sparsecomm's compressors as a DistributedDataParallel communication hook, the compressor
instance being the hook's state (as PyTorch's PowerSGD hook's state is):

    compression = sct.DGC(ratio=0.001, named_parameters=model.named_parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(compression, sct.ddp_hook)

Per bucket, each parameter's gradient goes through the compressor as under Horovod (the
settings check, the route, the method's pack and its step: Compressor.prepare), and the
bucket's exchanges run over DDP's process group, one collective per kind and phase
(sparsecomm.torch.ddp_parts):

  dense and shared routes   one all_reduce of their payloads, concatenated per dtype;
  allgather route           one all_gather of every rank's row counts and rows, or 1-/2-bit
                            segments (sparsecomm.core.wire), each padded to its capacity;
  spardl route              one all_to_all of the rows each block's owner gets, then one
                            all_gather of the owned sums (started by the next bucket's hook).

Each parameter's gradient is then written back into the bucket, averaged over the ranks as
DDP's own allreduce does, and the future holds the bucket's buffer. The collectives run while
DDP goes on with the backward pass; the unpack runs when the last of them has arrived.
"""

import time

import torch

from . import collectives
from .ddp_parts import Gathered, GatherLayout, Reduced, future_on
from .ddp_spardl import Scattered
from .exchange import Wire

ROUTES = ("dense", "allgather", "spardl")  # what exchange="auto" chooses among under the hook


_LAST_WORKS = []  # held to the interpreter's exit: see destroy_process_group


def destroy_process_group(group=None):
    """torch.distributed.destroy_process_group(group), after a barrier whose work this module
    keeps to the interpreter's exit, for the end of a training script.

    A Gloo thread that drops a finished work frees its tensors under the GIL. If the interpreter
    is already shutting down, the thread dies there and the process aborts ("terminate called
    without an active exception") after the job is done. The barrier's work holds the works
    before it, so they are freed by the main thread instead (docs/ddp.md, "Ending the job")."""
    last = torch.distributed.barrier(group=group, async_op=True)
    last.wait()
    _LAST_WORKS.append(last)
    torch.distributed.destroy_process_group(group)


def ddp_hook(compressor, bucket):
    """DDP's communication hook (``ddp.register_comm_hook(compressor, ddp_hook)``): the
    bucket's gradients compressed, exchanged over DDP's process group and averaged."""
    params, grads = bucket.parameters(), bucket.gradients()
    if len(grads) != len(params):
        raise NotImplementedError(
            f"{compressor.method.owner}: ddp_hook got a bucket of sparse gradients "
            f"(shapes {[list(p.shape) for p in params]}); it compresses dense gradients only: "
            "build the embedding with sparse=False"
        )
    # DDP leaves the gradient of a parameter no rank used None: the exchanged one is set here
    # (what its residual sent, as under Horovod), so error feedback loses nothing. It is the
    # bucket's view, as gradient_as_bucket_view=True wants it (DDP copies a used one there).
    unused = [(param, grad) for param, grad in zip(params, grads) if param.grad is None]
    ways = _attach_once(compressor)
    then = (lambda: _set_unused(unused)) if unused else None
    return BucketExchange(compressor, ways).start(params, grads, bucket.buffer(), bucket.is_last(), then)


def _set_unused(unused):
    for param, grad in unused:
        if param.grad is None:
            param.grad = grad


class HookCollectives(collectives.TorchDistributed):
    """torch.distributed's collectives for one compressor's hook, with its SparDL exchanges
    whose second phase has not started yet. Every collective starts in a hook, in the same
    order on every rank (DDP calls it bucket after bucket); none starts in a callback, where
    ranks could interleave buckets differently."""

    def __init__(self, group):
        super().__init__(group)
        self.scattered = []

    def advance_scattered(self):
        """The second phase of every SparDL exchange still waiting, in the order they started."""
        waiting, self.scattered = self.scattered, []
        for part in waiting:
            part.advance()


def _attach_once(compressor):
    """The compressor's torch.distributed collectives, set up on the first bucket: over the
    process group given as process_set (default: the default group)."""
    import torch.distributed as dist

    if isinstance(compressor.collectives, HookCollectives):
        return compressor.collectives
    group = compressor.process_set
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"{compressor.method.owner}: under ddp_hook, process_set should be a torch.distributed "
            f"ProcessGroup (DDP's process_group) or None, got {type(group).__name__}"
        )
    return attach(compressor, group, "ddp_hook")


def attach(compressor, group, way):
    """Sets up the compressor's exchanges over torch.distributed's `group` (None: the default
    group) for a hook (`way`, named in errors), and returns its collectives."""
    if compressor.exchange == "hierarchical":
        raise ValueError(
            f"{compressor.method.owner}: exchange='hierarchical' runs on Horovod's process sets of the hosts, "
            f"not under {way} yet: use 'allgather', 'spardl' or 'auto'"
        )
    if compressor.planner.auto is not None:
        compressor.planner.auto.limit_to(ROUTES)
    compressor.use_collectives(HookCollectives(group))
    return compressor.collectives


class BucketExchange:
    """One bucket's exchange: prepared per parameter, sent per kind, written back."""

    def __init__(self, compressor, ways):
        self.compressor, self.ways = compressor, ways
        self.ranks = ways.size()
        self.reduced, self.gathered = Reduced(ways), Gathered(ways, compressor.state.counters)
        self.scattered = Scattered(ways, compressor.state.counters)
        self.parts = (self.reduced, self.gathered, self.scattered)

    def start(self, params, grads, buffer, is_last, then=None):
        """Starts the exchange of `grads`, the gradients of `params` (views into `buffer`), and
        returns a future of `buffer` that holds their average over the ranks once it completes.
        `is_last`: no later bucket of this backward pass will start SparDL's second phase. `then`:
        called before the future completes."""
        self.ways.advance_scattered()  # earlier buckets' second phase, before this bucket's collectives
        started = time.perf_counter()
        compressor = self.compressor
        if grads:
            bucket = compressor.bucket_of(params, grads)  # (its shapes checked before any collective)
            routing = compressor.routing(buffer.device)  # (once a bucket, not per parameter)
            with compressor.packs.deferred(fixed=True):  # the bucket's sampled packs: one op, no host read
                routes, payloads = bucket.prepare(compressor, grads, routing)
            rows = bucket.stats_rows(self._add(bucket, routes, grads, payloads))
            compressor.state.counters.account_bucket(id(bucket), rows, time.perf_counter() - started)
        futures = [future for part in self.parts for future in part.start()]
        if is_last:
            self.ways.advance_scattered()
        result = future_on(buffer.device)
        torch.futures.collect_all(futures).add_done_callback(lambda done: self._finish(done, buffer, then, result))
        return result

    def _add(self, bucket, routes, grads, payloads):
        """Each gradient to the part of its route; this rank's traffic of each (sent elements, sent
        bytes, received bytes), as stats() counts it."""
        traffic = [None] * len(grads)
        for route, positions in routes.on.items():
            if route == "allgather":
                layout = self._gather_layout(bucket, routes, positions, payloads)
                moved = self.gathered.add_all(layout, [grads[i] for i in positions], [payloads[i] for i in positions])
                for position, each in zip(positions, moved):
                    traffic[position] = each
                continue
            for position in positions:
                grad, payload, state = grads[position], payloads[position], bucket.states[position]
                if route in ("dense", "shared"):
                    traffic[position] = self.reduced.add(grad, payload.values, payload if route == "shared" else None)
                else:
                    k = routes.ks[position]
                    wire = Wire(state.name, grad.shape, grad.dtype, None, self.ranks, k, state.residual, grad)
                    traffic[position] = self.scattered.add(wire, payload)
        return traffic

    def _gather_layout(self, bucket, routes, positions, payloads):
        """The allgather route's GatherLayout of these routes, worked out on their first step and
        kept on the bucket while they stand."""
        kept = bucket.kept
        if kept is not None and kept[0] is routes and kept[1] == self.ranks:
            return kept[2]
        method, shapes = self.compressor.method, bucket.shapes
        names, numels = [shapes[i][0] for i in positions], [shapes[i][1] for i in positions]
        capacities = [method.most_selected(routes.ks[i], shapes[i][1]) for i in positions]
        layout = GatherLayout(names, numels, capacities, [payloads[i] for i in positions], self.ranks)
        bucket.kept = (routes, self.ranks, layout)
        return layout

    def _finish(self, done, buffer, then, result):
        try:
            for future in done.value():
                future.wait()  # a collective's error raised here; on a GPU, this stream waits for it
            for part in self.parts:
                part.finish()
            if then is not None:
                then()
            result.set_result(buffer)
        except Exception as error:  # DDP raises it in the backward, on this rank
            result.set_exception(error)
