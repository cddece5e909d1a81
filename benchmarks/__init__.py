"""The repository's benchmarks (`make bench`, `make demo`): `python -m benchmarks {kernels,e2e,
trial,convergence,all,report}`, run from the checkout's root. A tool of the repository, not
installed with the package; the kernel benchmark they include is the package's own
(sparsecomm.check.kernels, which `make check` runs)."""
