"""sparsecomm for PyTorch: compressors for ``horovod.torch.DistributedOptimizer``.

import horovod.torch as hvd
import sparsecomm.torch as sct

compression = sct.RandomBlock(ratio=0.01, seed=42, named_parameters=model.named_parameters())
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                               compression=compression)
"""

from . import ops
from .compression import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK

__all__ = ["DGC", "RandomBlock", "RandomK", "RTopK", "Threshold", "TopK", "ops"]
