"""sparsecomm for TensorFlow: compressors for ``horovod.tensorflow`` (DistributedGradientTape,
allreduce, the tf-keras DistributedOptimizer) and a Keras 3 path (``sparsecomm.tensorflow.keras``).

    import horovod.tensorflow as hvd
    import sparsecomm.tensorflow as sctf

    compression = sctf.DGC(ratio=0.01, variables=model.trainable_variables)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
"""

from ..host_sets import host_process_sets
from . import ops
from .autograph import leave_horovod_unconverted
from .compression import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK

leave_horovod_unconverted()

__all__ = ["DGC", "RandomBlock", "RandomK", "RTopK", "Threshold", "TopK", "host_process_sets", "ops"]
