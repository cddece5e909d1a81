"""sparsecomm: sparse gradient compression for Horovod, for PyTorch and TensorFlow.

Import the framework you use; this package root imports neither:

    import sparsecomm.torch as sct        # compressors for horovod.torch
    import sparsecomm.tensorflow as sctf  # ops for horovod.tensorflow
"""

__version__ = "0.1.0"
