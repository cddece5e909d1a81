"""sparsecomm for PyTorch: compressors for ``horovod.torch.DistributedOptimizer``, and the
same compressors as a DistributedDataParallel communication hook (``ddp_hook``) and between
the replicas of FSDP2 (``register_fsdp_hook``: compressed HSDP, docs/fsdp.md).

import horovod.torch as hvd
import sparsecomm.torch as sct

compression = sct.RandomBlock(ratio=0.01, seed=42, named_parameters=model.named_parameters())
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                               compression=compression)

ddp = torch.nn.parallel.DistributedDataParallel(model)        # or, under torchrun
ddp.register_comm_hook(compression, sct.ddp_hook)
...
sct.destroy_process_group()                                   # at the end: docs/ddp.md
"""

from ..host_sets import host_process_sets
from . import ops
from .compression import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK
from .ddp import ddp_hook, destroy_process_group
from .fsdp import PerRankState, register_fsdp_hook

__all__ = [
    "DGC",
    "PerRankState",
    "RandomBlock",
    "RandomK",
    "RTopK",
    "Threshold",
    "TopK",
    "ddp_hook",
    "destroy_process_group",
    "host_process_sets",
    "ops",
    "register_fsdp_hook",
]
