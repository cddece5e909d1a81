"""sparsecomm for PyTorch: compressors for ``horovod.torch.DistributedOptimizer``.

    import horovod.torch as hvd
    import sparsecomm.torch as sct

    compression = sct.RandomBlock(ratio=0.01, seed=42, named_parameters=model.named_parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
"""
from . import ops
from .compression import RandomBlock, RandomK, RTopK, TopK

__all__ = ["RandomBlock", "RandomK", "RTopK", "TopK", "ops"]
