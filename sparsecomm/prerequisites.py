"""Horovod, the prerequisite sparsecomm's compressors exchange gradients through, imported on
first use (the ops, the self-test and a future DDP hook work without it) with an error that
says what is missing and the command that builds it."""

import importlib
import importlib.util

LABELS = {"torch": "PyTorch", "tensorflow": "TensorFlow"}
BUILD = "python -m sparsecomm.install_horovod  (builds Horovod 0.28.1 for this environment; docs/install.md)"


def horovod(framework):
    """horovod.torch or horovod.tensorflow, or an ImportError naming what is missing."""
    try:
        return importlib.import_module(f"horovod.{framework}")
    except ImportError as error:
        if importlib.util.find_spec("horovod") is None:
            raise ImportError(
                f"sparsecomm's compressors exchange gradients through Horovod, which is not "
                f"installed here. Install {LABELS[framework]} first, then:\n    {BUILD}"
            ) from error
        raise ImportError(
            f"Horovod is installed but `import horovod.{framework}` fails ({error}): it was built "
            f"without {LABELS[framework]}, or for another version of it. Rebuild it against the "
            f"installed {LABELS[framework]}:\n    {BUILD}"
        ) from error
