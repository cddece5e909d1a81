"""The suite's compiles through ccache, where it is installed (scripts/setup_env.sh installs it):
test_install.py's sdist builds and test_build.py's compile checks. ccache hashes a compile's
sources, headers, flags and compiler: a compile whose inputs repeat reads its object from the
cache, and any other compiles as before. CCACHE_DISABLE=1 turns it off."""

import os
import shutil

from sparsecomm import install_horovod

# Debian's folder of gcc, g++, cc and c++ that go through ccache: a build that finds its compiler
# on the PATH (setuptools, torch's ninja rules, nvcc's host compiler) uses them.
MASQUERADE = "/usr/lib/ccache"


def ccache():
    """ccache's path, or None where it is missing or turned off."""
    if os.environ.get("CCACHE_DISABLE", "") not in ("", "0"):
        return None
    return shutil.which("ccache")


def env_for(base_dir, path, unhashed_include=None):
    """The variables that send the compiles of a build through ccache ({} without it). `base_dir`:
    the folder under which the build's paths differ from run to run (ccache makes them relative,
    so that two runs share their objects); `path`: the build's PATH, which gets the masquerade;
    `unhashed_include`: a folder of no header the build reads, whose -I ccache leaves out of its
    direct-mode key (a fresh environment's include/, a new path each run)."""
    found = ccache()
    if found is None:
        return {}
    wanted = {
        "CCACHE_DIR": os.environ.get("CCACHE_DIR") or os.path.join(install_horovod.default_cache(), "ccache"),
        "CCACHE_BASEDIR": str(base_dir),
    }
    if unhashed_include is not None:
        wanted["CCACHE_IGNOREOPTIONS"] = " ".join(_include_options(str(unhashed_include), str(base_dir)))
    if os.path.isdir(MASQUERADE):
        wanted["PATH"] = os.pathsep.join([MASQUERADE, path])
    nvcc = shutil.which("nvcc", path=path)
    if nvcc:  # torch's CUDA rules run PYTORCH_NVCC where it is set
        wanted["PYTORCH_NVCC"] = f"{found} {nvcc}"
    return wanted


def _include_options(folder, base_dir):
    """-I`folder` as ccache hashes it: relative to the compiling folder where `folder` is under
    `base_dir` (a build compiles 1 to 4 folders below it), else as it is. With the run's new path
    in the key, the direct mode misses and ccache preprocesses every source before its hit."""
    relative = os.path.relpath(folder, base_dir)
    if relative.startswith(".."):
        return [f"-I{folder}"]
    return [f"-I{'../' * depth}{relative}" for depth in range(1, 5)]


def command(cmd, base_dir):
    """A compiler's command line `cmd` through ccache, and the variables it runs with: (cmd, env)."""
    found = ccache()
    if found is None:
        return cmd, dict(os.environ)
    wanted = env_for(base_dir, os.environ.get("PATH", ""))
    return [found, *cmd], dict(os.environ, CCACHE_DIR=wanted["CCACHE_DIR"], CCACHE_BASEDIR=wanted["CCACHE_BASEDIR"])
