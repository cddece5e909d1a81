"""The collectives a compressor runs besides its exchanges: the settings check, the network
measurement of exchange="auto" and the route trial's means. Two ways in provide them:
Horovod (hvd.DistributedOptimizer) and torch.distributed (the DDP communication hook).

    size()                              the number of ranks
    rank()                              this rank's place among them (0 on one process)
    allgather_ints(ints, name)          every rank's ints, concatenated in rank order
    mean_over_ranks(values, name)       the values averaged over the ranks
    allreduce(tensor, name)             a blocking sum (the network measurement)
    allgathers(tensor, count, name)     `count` allgathers in flight at once, then waited for
    hosts()                             (HostLayout, the collectives of this rank's host) where the
                                        hierarchical exchange can run, else None
"""

import torch

from .. import host_sets
from . import exchange


class Horovod:
    """Over Horovod's process set (None: all ranks): the optimizer's."""

    def __init__(self, process_set=None):
        self.given = process_set

    def process_set(self):
        return self.given or exchange.horovod().global_process_set

    def size(self):
        return self.process_set().size() if exchange.horovod().is_initialized() else 1

    def rank(self):
        return self.process_set().rank() if exchange.horovod().is_initialized() else 0

    def allgather_ints(self, ints, name):
        ints = torch.tensor(ints, dtype=torch.int64)
        return exchange.horovod().allgather(ints, name=name, process_set=self.process_set()).tolist()

    def mean_over_ranks(self, values, name):  # Horovod's default op averages
        values = torch.tensor(values, dtype=torch.float64)
        return exchange.horovod().allreduce(values, name=name, process_set=self.process_set()).tolist()

    def allreduce(self, tensor, name):
        return exchange.horovod().allreduce(
            tensor, name=name, op=exchange.horovod().Sum, process_set=self.process_set()
        )

    def allgathers(self, tensor, count, name):
        hvd = exchange.horovod()
        handles = [
            hvd.allgather_async(tensor, name=f"{name}.{i}", process_set=self.process_set()) for i in range(count)
        ]
        for handle in handles:
            hvd.synchronize(handle)

    def hosts(self):
        """host_sets.measurable over this set, where every rank found the hosts (one allgather:
        a rank that measures the host's link alone would wait for the others forever)."""
        found = host_sets.measurable(exchange.horovod(), self.size())
        if not all(self.allgather_ints([found is not None], "sparsecomm.measure.hosts")):
            return None
        layout, local = found
        return layout, Horovod(local)

    def host_layout(self):
        """(hosts, ranks a host) where every rank found the hosts' process sets, else None."""
        found = self.hosts()
        return None if found is None else (found[0].hosts, found[0].per_host)


class TorchDistributed:
    """Over a torch.distributed process group (None: the default group): DDP's."""

    def __init__(self, group=None):
        self.group = group
        self._sized, self._size = None, 1  # the group whose size is cached: read per parameter, fixed per group

    def device(self):
        """Where this group's collectives take their tensors: NCCL reduces only GPU memory."""
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def size(self):
        import torch.distributed as dist

        group = self.group if self.group is not None else dist.group.WORLD  # (None until initialised)
        if group is None:
            return 1
        if group is not self._sized:
            self._sized, self._size = group, dist.get_world_size(self.group)
        return self._size

    def rank(self):
        import torch.distributed as dist

        return dist.get_rank(self.group) if dist.is_initialized() else 0

    def allgather_ints(self, ints, name):
        # Each rank's count may differ (a settings mismatch is what the check looks for): objects.
        import torch.distributed as dist

        everyone = [None] * self.size()
        dist.all_gather_object(everyone, [int(i) for i in ints], group=self.group)
        return [i for ints in everyone for i in ints]

    def mean_over_ranks(self, values, name):
        total = self.allreduce(torch.tensor(values, dtype=torch.float64, device=self.device()), name)
        return (total / self.size()).tolist()

    def allreduce(self, tensor, name):
        import torch.distributed as dist

        tensor = tensor.clone()
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def hosts(self):
        return None  # the hierarchical exchange runs on Horovod's process sets only

    def host_layout(self):
        return None

    def allgathers(self, tensor, count, name):
        outputs = [tensor.new_empty(self.size() * tensor.numel()) for _ in range(count)]
        works = [all_gather_into(out, tensor, self.group, async_op=True) for out in outputs]
        for work in works:
            work.wait()


def all_gather_into(output, tensor, group, async_op=False):
    """torch.distributed's all-gather into one flat tensor (all_gather_single from torch 2.13)."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)
