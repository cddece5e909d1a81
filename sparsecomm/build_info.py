"""What this sparsecomm was built with (``_build_info.json``, written by setup.py), and the checks
made before a compiled library is loaded: a build made for another torch, TensorFlow or CPU
says which, and how to rebuild, instead of failing inside the dynamic loader.

Imports neither torch nor TensorFlow: the callers pass the installed versions."""

import json
import os

PACKAGE = os.path.dirname(os.path.abspath(__file__))
INFO_FILE = os.path.join(PACKAGE, "_build_info.json")


class BuildMismatch(ImportError):
    """The compiled part of sparsecomm does not fit this environment."""


def is_checkout():
    """True where the package sits in a source checkout (setup.py and csrc/ beside it)."""
    parent = os.path.dirname(PACKAGE)
    return os.path.isfile(os.path.join(parent, "setup.py")) and os.path.isdir(os.path.join(parent, "csrc"))


def rebuild_command():
    """The command that rebuilds sparsecomm here, against the installed frameworks."""
    if is_checkout():
        return f"cd {os.path.dirname(PACKAGE)} && pip install --no-build-isolation -e .  (or `make build`)"
    return (
        "pip install --no-cache-dir --no-build-isolation --no-deps --force-reinstall sparsecomm-*.tar.gz"
        "  (the sdist you installed)"
    )


def read():
    """The build record, or None where nothing was built (a checkout before its first build)."""
    try:
        with open(INFO_FILE) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def require(framework, installed_version, cpu_flags=None):
    """The build record, after checking that sparsecomm was built for `framework` ("torch" or
    "tensorflow") at `installed_version` and for this CPU. Raises BuildMismatch otherwise."""
    info = read()
    label = {"torch": "torch", "tensorflow": "TensorFlow"}[framework]
    if info is None:
        raise BuildMismatch(
            f"sparsecomm's compiled kernels are not built (no {INFO_FILE}); build them with:\n    {rebuild_command()}"
        )
    built = info.get(framework)
    if built is None:
        raise BuildMismatch(
            f"sparsecomm was built without {label} support ({label} was not installed then); "
            f"{label} {installed_version} is installed now, so rebuild with:\n    {rebuild_command()}"
        )
    if built["version"] != installed_version:
        raise BuildMismatch(
            f"sparsecomm was built for {label} {built['version']}, but {label} {installed_version} "
            f"is installed: its compiled kernels only load with the {label} they were built "
            f"against. Rebuild with:\n    {rebuild_command()}"
        )
    check_cpu(info, cpu_flags)
    return info


def cpu_flags_here():
    """This CPU's feature flags (Linux /proc/cpuinfo), or None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def check_cpu(info, flags=None):
    """The instruction-set extensions the build may use must all be on this CPU (else it would
    die with an illegal instruction)."""
    flags = cpu_flags_here() if flags is None else flags
    if flags is None:
        return
    missing = [feature for feature in info.get("cpu_features", []) if feature not in flags]
    if missing:
        raise BuildMismatch(
            f"sparsecomm was built for CPUs with {', '.join(missing)} (SPARSECOMM_CPU_ARCH="
            f"{info.get('cpu_arch')}), which this CPU lacks. Rebuild here, or for a portable "
            f"build set SPARSECOMM_CPU_ARCH=x86-64-v2 (or empty):\n    {rebuild_command()}"
        )


def describe(info):
    """The build record in a few short lines."""
    if info is None:
        return ["not built"]
    features = ", ".join(info.get("cpu_features", [])) or "no extensions"
    lines = [
        f"sparsecomm {info['sparsecomm']} for Python {info['python']}, CPU target "
        f"{info.get('cpu_arch') or 'the compiler default'} ({features})"
    ]
    torch = info.get("torch")
    lines.append(
        "torch: "
        + (
            f"{torch['version']} (CUDA {torch['cuda'] or 'none'}), CUDA kernels "
            + (f"yes ({torch.get('cuda_arch_list')})" if torch["cuda_kernels"] else "no")
            if torch
            else "not built"
        )
    )
    tf = info.get("tensorflow")
    lines.append(
        "TensorFlow: "
        + (
            f"{tf['version']}, GPU kernels " + (f"yes ({tf.get('cuda_arch')})" if tf["gpu_kernels"] else "no")
            if tf
            else "not built"
        )
    )
    return lines
