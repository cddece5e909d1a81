"""sparsecomm's self-check: ``python -m sparsecomm.check [--quick] [--json PATH]`` (``make check``).

Runs the op tests, the kernel benchmark and a 2-rank training smoke test on this machine's
GPUs (and on its CPU), and prints a verdict table; see sparsecomm/check/cli.py for the steps.
Importing this package imports nothing else."""
