"""sparsecomm: sparse gradient compression for Horovod, for PyTorch and TensorFlow.

Import the framework you use; this package root imports neither:

    import sparsecomm.torch as sct        # compressors for horovod.torch
    import sparsecomm.tensorflow as sctf  # compressors for horovod.tensorflow

``sparsecomm.Network(bandwidth, latency)`` describes a cluster for exchange="auto".
"""

from .core.cost import Network

__version__ = "0.1.0"
__all__ = ["Network"]
