"""The repository's benchmarks (`make bench`, `make demo`): `python -m benchmarks {kernels,e2e,
trial,convergence,all,report}`, run from the checkout's root. A tool of the repository, not
installed with the package; the kernel benchmark they include is the package's own
(sparsecomm.check.kernels, which `make check` runs)."""

import os
import sys

# benchmarks/requirements.txt, installed apart from the run-time environment (scripts/setup_env.sh):
# last on the path, so that the environment's own packages come first.
PACKAGES = os.path.join(sys.prefix, "bench-packages")
if os.path.isdir(PACKAGES) and PACKAGES not in sys.path:
    sys.path.append(PACKAGES)
