"""Worker: the same compressors, settings and per-rank gradients through Horovod's own
allreduce-with-compression, in PyTorch (--framework torch) or TensorFlow (--framework tf).
Saves what every step returned and the compressor state, for a bitwise comparison of the
two runs.

--sizes N ...: one run per N, one after another in the same launch, on the first N ranks
(common.sizes_of: a process set of them, the whole job for the job's size)."""

import argparse
import os

import common
import numpy as np

from sparsecomm import Network

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--framework", choices=["torch", "tf"], required=True)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--host-sets", action="store_true", help="only HIERARCHICAL, on the hosts horovodrun's -H gives")
args = common.add_sizes_argument(parser).parse_args()

TENSORS = {"a.weight": ((40, 50), "float32"), "b.weight": ((300,), "float16"), "c.weight": ((7, 33), "bfloat16")}
# name -> (class name, arguments); every tensor compressed (EVERY) except with "policy"
CONFIGS = {
    "random_block": ("RandomBlock", dict(ratio=0.1, seed=3)),
    "randomk": ("RandomK", dict(ratio=0.1, seed=3)),
    "topk": ("TopK", dict(exchange="allgather", ratio=0.05)),
    "rtopk": ("RTopK", dict(exchange="allgather", ratio=0.05, r=0.2, seed=3)),
    "threshold": ("Threshold", dict(exchange="allgather", ratio=0.05)),
    "threshold_bf16": ("Threshold", dict(exchange="allgather", ratio=0.05, quantize="bf16")),
    "threshold_2bit": ("Threshold", dict(exchange="allgather", ratio=0.05, quantize="2bit")),
    "dgc_warmup": ("DGC", dict(exchange="allgather", ratio=0.05, warmup_steps=2, warmup_stages=1)),
    "dgc_policy": ("DGC", dict(exchange="allgather", ratio=0.05, policy=True)),
    "topk_spardl": ("TopK", dict(exchange="spardl", ratio=0.05)),
    "rtopk_spardl": ("RTopK", dict(exchange="spardl", ratio=0.05, r=0.2, seed=3)),
    "threshold_spardl": ("Threshold", dict(exchange="spardl", ratio=0.05)),
    "dgc_spardl": ("DGC", dict(exchange="spardl", ratio=0.05, warmup_steps=2, warmup_stages=1)),
    # exchange="auto" on given networks: sparse (allgather on 2 ranks, SparDL from 3) and dense
    "topk_auto_slow": ("TopK", dict(ratio=0.05, network=Network(bandwidth=1e7, latency=1e-6))),
    "topk_auto_fast": ("TopK", dict(ratio=0.05, network=Network(bandwidth=1e12, latency=0.0, copy_bandwidth=1e8))),
}

# exchange="hierarchical" (--host-sets): the host process sets registered at hvd.init
HIERARCHICAL = {
    "topk_hierarchical": ("TopK", dict(exchange="hierarchical", ratio=0.05)),
    "rtopk_hierarchical": ("RTopK", dict(exchange="hierarchical", ratio=0.05, r=0.2, seed=3)),
    "threshold_hierarchical": ("Threshold", dict(exchange="hierarchical", ratio=0.05)),
    "threshold_bf16_hierarchical": ("Threshold", dict(exchange="hierarchical", ratio=0.05, quantize="bf16")),
    "dgc_hierarchical": ("DGC", dict(exchange="hierarchical", ratio=0.05, warmup_steps=2, warmup_stages=1)),
}
# TF only (torch's auto watches its backward first: tests/workers/torch_hierarchical.py): exchange="auto"
# measuring the hosts, then its network set to a slow NIC and a fast host link, so that it routes every
# tensor hierarchical: the bits of topk_hierarchical
AUTO_HOSTS = {"topk_auto_hosts": ("TopK", dict(ratio=0.05))}
SLOW_NIC, FAST_LINK = Network(bandwidth=1e4, latency=1e-6), Network(bandwidth=1e10, latency=1e-6)
if args.host_sets:
    CONFIGS = HIERARCHICAL


def init(hvd):
    """hvd.init, with the hosts' process sets where the hierarchical configs run ({None: the
    global set}), else with the sets of --sizes (common.sizes_of)."""
    from sparsecomm.host_sets import host_process_sets

    if args.host_sets:
        hvd.init(process_sets=host_process_sets())
        return {None: hvd.global_process_set}
    return common.sizes_of(hvd, args.sizes)


def save_each(hvd, sets, run, zeros):
    """run(process_set) -> the arrays of one size, for each size this rank is in, saved under
    its size (none for --host-sets)."""

    def saved(size, process_set):
        out = run(process_set)
        suffix = "" if size is None else f"_np{size}"
        np.savez(os.path.join(args.out, f"{args.framework}{suffix}_rank{process_set.rank()}.npz"), **out)
        print(f"{args.framework} rank {process_set.rank()} of {process_set.size()}: {len(out)} arrays")

    common.for_each_size(hvd, sets, saved, zeros)


# Rank 1's gradient of a.weight at step 1 has a NaN and +-inf (the NaN/Inf policy in both frameworks).
BURST = {"a.weight": {5: np.nan, 700: np.inf, 1500: -np.inf}}


def gradient(name, step, rank):
    shape, _ = TENSORS[name]
    grad = np.random.default_rng([step, rank, len(name)]).standard_normal(shape).astype(np.float32)
    if step == 1 and rank == 1 and name in BURST:
        grad.reshape(-1)[list(BURST[name])] = list(BURST[name].values())
    return grad


def run_torch():
    import horovod.torch as hvd
    import torch

    import sparsecomm.torch as family

    sets = init(hvd)
    params = {
        n: torch.nn.Parameter(torch.zeros(shape, dtype=getattr(torch, dtype))) for n, (shape, dtype) in TENSORS.items()
    }

    def run(process_set):
        out, on = {}, common.set_arguments(hvd, process_set)
        for config, (cls, kwargs) in CONFIGS.items():
            kwargs = dict(kwargs)
            policy = {} if kwargs.pop("policy", False) else common.EVERY
            compressor = getattr(family, cls)(named_parameters=list(params.items()), **kwargs, **policy, **on)
            for step in range(args.steps):
                for name, p in params.items():
                    p.grad = torch.from_numpy(gradient(name, step, process_set.rank())).to(p.dtype)
                    got = hvd.allreduce(p.grad, op=hvd.Average, compression=compressor, name=f"{config}.{name}", **on)
                    out[f"{config}/{step}/{name}"] = got.float().numpy()
            for name, per in compressor.stats()["tensors"].items():
                out[f"{config}/exchange/{name}"] = np.array(per.get("exchange", "fixed"))
            for name, state in compressor.state.parameters.items():
                for key in ("residual", "momentum"):
                    if getattr(state, key) is not None:
                        out[f"{config}/{key}/{name}"] = getattr(state, key).numpy()
        return out

    save_each(hvd, sets, run, torch.zeros(1))


def run_tf():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import sparsecomm.tensorflow as family

    sets = init(hvd)
    variables = [(n, tf.Variable(tf.zeros(shape, dtype))) for n, (shape, dtype) in TENSORS.items()]

    def run(process_set):
        out, on = {}, common.set_arguments(hvd, process_set)
        for config, (cls, kwargs) in {**CONFIGS, **(AUTO_HOSTS if args.host_sets else {})}.items():
            kwargs = dict(kwargs)
            policy = {} if kwargs.pop("policy", False) else common.EVERY
            compressor = getattr(family, cls)(variables=variables, **kwargs, **policy, **on)
            if config in AUTO_HOSTS:
                measure_hosts_then_set(compressor, out, config)
            for step in range(args.steps):
                for name, v in variables:
                    grad = tf.cast(tf.constant(gradient(name, step, process_set.rank())), v.dtype)
                    got = hvd.allreduce(grad, op=hvd.Average, compression=compressor, name=f"{config}.{name}", **on)
                    out[f"{config}/{step}/{name}"] = tf.cast(got, tf.float32).numpy()
            for name, per in compressor.stats()["tensors"].items():
                out[f"{config}/exchange/{name}"] = np.array(per.get("exchange", "fixed"))
            for state in compressor.state:
                for key in ("residual", "momentum"):
                    if getattr(state, key) is not None:
                        out[f"{config}/{key}/{state.variable_name}"] = getattr(state, key).numpy()
        return out

    save_each(hvd, sets, run, tf.zeros(1))


def measure_hosts_then_set(compressor, out, config):
    """Records what the measurement found of the hosts, and routes on SLOW_NIC and FAST_LINK."""
    from sparsecomm.core import cost

    measure = compressor._measure_network

    def measured(device=None):
        _, local, windows, hosts = measure(device)
        out[f"{config}/hosts"] = np.array([hosts.count, hosts.per_host, hosts.link.bandwidth])
        return SLOW_NIC, local, windows, cost.Hosts(hosts.count, hosts.per_host, FAST_LINK)

    compressor._measure_network = measured


run_torch() if args.framework == "torch" else run_tf()
