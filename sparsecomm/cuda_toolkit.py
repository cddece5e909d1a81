"""Where the CUDA toolkit is, for sparsecomm's build (setup.py loads this file by path, before the
package exists) and Horovod's (install_horovod). Imports nothing of sparsecomm."""

import os
import re
import shutil
import subprocess


def find_cuda_home():
    """$CUDA_HOME (or $CUDA_PATH) when it holds nvcc and the headers, else the toolkit of the nvcc
    on the PATH, asked with --dryrun so that a wrapper script (/usr/local/bin/nvcc, which makes
    torch guess /usr/local) is seen through. None: no nvcc."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and all(
        os.path.exists(os.path.join(home, *part)) for part in (("bin", "nvcc"), ("include", "cuda_runtime.h"))
    ):
        return home
    nvcc = shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if os.path.exists(p)), None)
    if nvcc is None:
        return None
    proc = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True, text=True
    )
    here = re.search(r"^#\$ _HERE_=(.+)$", proc.stderr + proc.stdout, re.M)
    return os.path.realpath(os.path.join(here.group(1).strip() if here else os.path.dirname(nvcc), ".."))
