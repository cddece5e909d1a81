"""Worker (torchrun, Gloo): compressed HSDP. FSDP2 shards each model over the 2 ranks of a
"host" (the mesh's "shard" dimension) and sparsecomm.torch.register_fsdp_hook exchanges the
shards' gradients across the replicas; SGD steps on the digits, as torch_train.py's. Saves
every step's full parameters (full_tensor()) and each compressor's stats, per rank; with
--resume-at N, each configuration's run saves its checkpoint after step N and trains on, and a
fresh model loads it and trains the steps after N (the history after the restart)."""

import argparse
import os

import common
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from common import EVERY
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from sparsecomm.torch import (
    DGC,
    PerRankState,
    RandomBlock,
    RandomK,
    RTopK,
    Threshold,
    TopK,
    destroy_process_group,
    register_fsdp_hook,
)

SHARDS = 2

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--lr", type=float, default=0.5)
parser.add_argument("--only", nargs="*", help="these configurations alone")
parser.add_argument("--resume-at", type=int, help="also stop after this step and resume from a checkpoint")
args = parser.parse_args()

dist.init_process_group("gloo")
torch.set_num_threads(1)
rank, size = dist.get_rank(), dist.get_world_size()
MESH = init_device_mesh("cpu", (size // SHARDS, SHARDS), mesh_dim_names=("replicate", "shard"))
x_all, y_all = common.digits()

GATHERED = dict(exchange="allgather", **EVERY)
SCATTERED = dict(exchange="spardl", **EVERY)


def named(cls, **settings):
    return lambda model: cls(named_parameters=model.named_parameters(), **settings)


# name -> (compression for the sharded model, or None for native HSDP; options: model ("mlp";
# "frozen": three sharded layers, the first frozen; "everyday": common.torch_everyday_model, its
# hidden layer sharded apart, the root holding a tied weight, a frozen layer and a branch some
# ranks skip on some steps), passes (backward passes a step, the
# gradients accumulated without sync before the last), bf16 (bf16 parameters, float32 reduce; or
# "reduce": reduced in bf16 too),
# momentum (SGD's, whose buffers the checkpoint holds too))
CONFIGS = {
    "native": (None, {}),
    "topk_0.1": (named(TopK, ratio=0.1, **GATHERED), {}),
    "topk_1.0": (named(TopK, ratio=1.0, dense_fallback=False, **GATHERED), {}),
    "topk_0.1_spardl": (named(TopK, ratio=0.1, **SCATTERED), {}),
    "topk_0.1_sgd_momentum": (named(TopK, ratio=0.1, **GATHERED), dict(momentum=0.9)),
    "topk_0.1_default_policy": (named(TopK, ratio=0.1, exchange="allgather"), {}),
    "rtopk_0.1": (named(RTopK, ratio=0.1, r=0.3, seed=7, **GATHERED), {}),
    "threshold_0.1": (named(Threshold, ratio=0.1, **GATHERED), {}),
    "threshold_0.1_2bit": (named(Threshold, ratio=0.1, quantize="2bit", **GATHERED), {}),
    "threshold_0.1_spardl": (named(Threshold, ratio=0.1, **SCATTERED), {}),
    "dgc_0.1": (named(DGC, ratio=0.1, momentum=0.9, **GATHERED), {}),
    "dgc_0.1_spardl": (named(DGC, ratio=0.1, momentum=0.9, **SCATTERED), {}),
    "dgc_0.1_clip": (named(DGC, ratio=0.1, momentum=0.9, clip_norm=0.2, **GATHERED), {}),
    "randomk_0.1": (named(RandomK, ratio=0.1, seed=7, **EVERY), {}),
    "random_block_0.1": (named(RandomBlock, ratio=0.1, seed=7, **EVERY), {}),
    "frozen/native": (None, dict(model="frozen")),
    "frozen/topk_0.1": (named(TopK, ratio=0.1, **GATHERED), dict(model="frozen")),
    "frozen/dgc_0.1_accumulate": (named(DGC, ratio=0.1, momentum=0.9, **GATHERED), dict(model="frozen", passes=2)),
    "frozen/topk_0.1_bf16": (named(TopK, ratio=0.1, **GATHERED), dict(model="frozen", bf16=True)),
    "frozen/topk_0.1_bf16_reduce": (named(TopK, ratio=0.1, **GATHERED), dict(model="frozen", bf16="reduce")),
    "everyday/native": (None, dict(model="everyday")),
    "everyday/topk_0.1": (named(TopK, ratio=0.1, **GATHERED), dict(model="everyday")),
    "everyday/dgc_0.1": (named(DGC, ratio=0.1, momentum=0.9, **GATHERED), dict(model="everyday")),
    "topk_0.1_auto": (named(TopK, ratio=0.1, **EVERY), {}),  # exchange="auto" over the replicas' link
}
MODELS = {"mlp": common.torch_model, "frozen": common.torch_frozen_model, "everyday": common.torch_everyday_model}


def sharded(options):
    """The model of `options`, its linear layers (the everyday model's hidden one) and the root
    sharded with fully_shard: over the host's ranks, or (native HSDP, no compressor) over the 2-D
    mesh, reducing the zeros of unused parameters as register_fsdp_hook does."""
    model = MODELS[options.get("model", "mlp")]()
    mesh = MESH if options.get("native") else MESH["shard"]
    reduce_dtype = torch.bfloat16 if options.get("bf16") == "reduce" else torch.float32
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    extra = dict(mp_policy=bf16) if options.get("bf16") else {}
    layers = [model.hidden] if options.get("model") == "everyday" else model
    for layer in layers:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, **extra)
    fully_shard(model, mesh=mesh, **extra)
    if options.get("native"):
        model.set_reduce_scatter_unused_params(True)  # (with a compressor, register_fsdp_hook sets it)
    return model


def run_steps(model, opt, steps, options):
    passes, everyday = options.get("passes", 1), options.get("model") == "everyday"
    history = []
    for step in steps:
        opt.zero_grad()
        for p in range(passes):  # accumulated without sync, reduced on the last pass
            model.set_requires_gradient_sync(p == passes - 1)
            idx = common.rows(step * passes + p, rank, size, len(y_all))
            branch = dict(branch=common.uses_branch(step, rank)) if everyday else {}
            out = model(torch.from_numpy(x_all[idx]), **branch)
            torch.nn.functional.cross_entropy(out.float(), torch.from_numpy(y_all[idx])).backward()
        opt.step()
        history.append({n: p.full_tensor().detach().clone() for n, p in model.named_parameters()})
    return history


def train(make_compression, options, steps, checkpoint=None, save_after=None):
    """The full parameters after each step, and the compressor (None: native HSDP). `checkpoint`:
    the folder of the model's, the optimizer's and the compressor's state: resumed from, or with
    `save_after`, written after that step while the training goes on (a save must change nothing)."""
    model = sharded(dict(options, native=make_compression is None))
    compression = None if make_compression is None else make_compression(model)
    if compression is not None:
        register_fsdp_hook(model, compression, MESH["replicate"])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=options.get("momentum", 0))
    if checkpoint is not None and save_after is None:
        load(checkpoint, model, opt, compression)
    if save_after is None:
        return run_steps(model, opt, steps, options), compression
    history = run_steps(model, opt, [s for s in steps if s <= save_after], options)
    save(checkpoint, model, opt, compression)
    return history + run_steps(model, opt, [s for s in steps if s > save_after], options), compression


def save(path, model, opt, compression):
    """The model's and optimizer's shards and every rank's compressor state, by
    torch.distributed.checkpoint, as a user's job writes them."""
    model_state, opt_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "opt": opt_state, "compression": PerRankState(compression)}, checkpoint_id=path)


def load(path, model, opt, compression):
    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "opt": opt_state, "compression": PerRankState(compression)}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])


def refusal_of_replicas_apart():
    """register_fsdp_hook's error on replicas initialised apart (each its own seed), or None."""
    torch.manual_seed(rank // SHARDS)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    fully_shard(model, mesh=MESH["shard"])
    try:
        register_fsdp_hook(model, TopK(ratio=0.5, named_parameters=model.named_parameters()), MESH["replicate"])
    except ValueError as error:
        return str(error)
    return None


refused = refusal_of_replicas_apart()
results, stats = {}, {}
for config, (make_compression, options) in CONFIGS.items():
    if args.only and config not in args.only:
        continue
    resume = args.resume_at is not None and make_compression is not None
    path = os.path.join(args.out, "checkpoints", config.replace("/", "_"))
    saved = dict(checkpoint=path, save_after=args.resume_at) if resume else {}
    results[config], compression = train(make_compression, options, range(args.steps), **saved)
    stats[config] = None if compression is None else compression.stats()
    if resume:  # a fresh job from the checkpoint: the steps after it
        results[f"{config}/resumed"], _ = train(
            make_compression, options, range(args.resume_at + 1, args.steps), checkpoint=path
        )
torch.save({"history": results, "stats": stats, "refused": refused}, os.path.join(args.out, f"rank{rank}.pt"))
print(f"rank {rank}/{size}: {len(results)} configs x {args.steps} steps done")
destroy_process_group()
