"""sparsecomm for TensorFlow: kernels bound as TF ops (``sparsecomm.tensorflow.ops``).

The compressor family for ``horovod.tensorflow`` is built on these ops."""
from . import ops

__all__ = ["ops"]
