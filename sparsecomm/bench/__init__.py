"""Benchmarks: `python -m sparsecomm.bench kernels --json PATH`."""
