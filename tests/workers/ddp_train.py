"""Worker (torchrun, Gloo): torch_train.py's SGD steps under DistributedDataParallel with
sparsecomm.torch.ddp_hook, for each compressor; saves every rank's parameters after every step
and each compressor's stats."""

import contextlib
import os

import common
import torch
import torch.distributed as dist
from common import EVERY

from sparsecomm.torch import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK, ddp_hook, destroy_process_group

parser = common.worker_parser(steps=5, lr=0.5)
parser.add_argument("--only", nargs="*", help="these configurations alone")
args = parser.parse_args()

dist.init_process_group("gloo")
torch.set_num_threads(1)
rank, size = dist.get_rank(), dist.get_world_size()
x_all, y_all = common.digits()
GROUP = dist.new_group(list(range(size)))  # a process group other than the default one


def named(cls, **settings):
    return lambda model: cls(named_parameters=model.named_parameters(), **settings)


GATHERED = dict(exchange="allgather", **EVERY)
SCATTERED = dict(exchange="spardl", **EVERY)
# name -> (compression for the model, or None for DDP's own allreduce; options: SGD's momentum,
# DDP's bucket_cap_mb, gradient_as_bucket_view, static_graph and process_group, and passes:
# backward passes a step, all but the last under no_sync())
CONFIGS = {
    "dense": (None, {}),
    "dense_momentum": (None, dict(momentum=0.9)),
    "random_block_0.1": (named(RandomBlock, ratio=0.1, seed=7, **EVERY), {}),
    "random_block_0.1_momentum": (named(RandomBlock, ratio=0.1, seed=7, **EVERY), dict(momentum=0.9)),
    "random_block_1.0": (named(RandomBlock, ratio=1.0, seed=7, **EVERY), {}),
    "randomk_0.1": (named(RandomK, ratio=0.1, seed=7, **EVERY), {}),
    "randomk_1.0": (named(RandomK, ratio=1.0, seed=7, **EVERY), {}),
    "topk_0.1": (named(TopK, ratio=0.1, **GATHERED), {}),
    "topk_0.1_buckets": (named(TopK, ratio=0.1, **GATHERED), dict(bucket_cap_mb=0.0005)),  # a bucket a parameter
    "topk_1.0": (named(TopK, ratio=1.0, dense_fallback=False, **GATHERED), {}),
    "topk_0.1_bucket_view": (named(TopK, ratio=0.1, **GATHERED), dict(gradient_as_bucket_view=True)),
    "topk_0.1_static_graph": (named(TopK, ratio=0.1, **GATHERED), dict(static_graph=True)),
    "topk_0.1_spardl_static_graph": (named(TopK, ratio=0.1, **SCATTERED), dict(static_graph=True)),
    "topk_0.1_group": (named(TopK, ratio=0.1, process_set=GROUP, **GATHERED), dict(process_group=GROUP)),
    "topk_0.1_no_sync": (named(TopK, ratio=0.1, **GATHERED), dict(passes=2)),
    "dgc_0.1_no_sync": (named(DGC, ratio=0.1, momentum=0.9, **GATHERED), dict(passes=2)),
    "topk_0.1_auto": (named(TopK, ratio=0.1, **EVERY), {}),  # exchange="auto", the default
    "topk_0.1_no_feedback": (named(TopK, ratio=0.1, error_feedback=False, **GATHERED), {}),
    "topk_0.1_default_policy": (named(TopK, ratio=0.1, exchange="allgather"), {}),
    "rtopk_0.1": (named(RTopK, ratio=0.1, r=0.3, seed=7, **GATHERED), {}),
    "rtopk_1.0": (named(RTopK, ratio=1.0, seed=7, dense_fallback=False, **GATHERED), {}),
    "threshold_0.1": (named(Threshold, ratio=0.1, **GATHERED), {}),
    "threshold_0.1_fp16": (named(Threshold, ratio=0.1, quantize="fp16", **GATHERED), {}),
    "threshold_1.0": (named(Threshold, ratio=1.0, dense_fallback=False, **GATHERED), {}),
    "threshold_0.1_1bit": (named(Threshold, ratio=0.1, quantize="1bit", **GATHERED), {}),
    "threshold_0.1_2bit": (named(Threshold, ratio=0.1, quantize="2bit", **GATHERED), {}),
    "topk_0.1_spardl": (named(TopK, ratio=0.1, **SCATTERED), {}),
    "topk_0.1_spardl_buckets": (named(TopK, ratio=0.1, **SCATTERED), dict(bucket_cap_mb=0.0005)),
    "topk_1.0_spardl": (named(TopK, ratio=1.0, dense_fallback=False, **SCATTERED), {}),
    "threshold_0.1_spardl": (named(Threshold, ratio=0.1, **SCATTERED), {}),
    "rtopk_0.1_spardl": (named(RTopK, ratio=0.1, r=0.3, seed=7, **SCATTERED), {}),
    "dgc_0.1_spardl": (named(DGC, ratio=0.1, momentum=0.9, **SCATTERED), {}),
    "dgc_0.1": (named(DGC, ratio=0.1, momentum=0.9, **GATHERED), {}),
    "dgc_0.05_warmup_clip": (
        named(DGC, ratio=0.05, momentum=0.9, warmup_steps=4, warmup_stages=2, clip_norm=0.2, **GATHERED),
        {},
    ),
    "dgc_1.0_no_masking": (
        named(DGC, ratio=1.0, momentum=0.9, momentum_masking=False, dense_fallback=False, **GATHERED),
        {},
    ),
    "dgc_0.1_default_policy": (named(DGC, ratio=0.1, momentum=0.9, exchange="allgather"), {}),
    "dgc_0.1_default_policy_clip": (named(DGC, ratio=0.1, momentum=0.9, clip_norm=0.2, exchange="allgather"), {}),
    "dgc_0.1_nesterov": (named(DGC, ratio=0.1, momentum=0.9, nesterov=True, exchange="allgather"), {}),
    "dgc_0.5_warmup_dense_stage": (
        named(DGC, ratio=0.5, momentum=0.9, warmup_steps=2, warmup_stages=1, **GATHERED),
        {},
    ),
}
# The everyday model (common.torch_everyday_model: a tied weight, a frozen layer, a branch some
# ranks skip on some steps) with find_unused_parameters=True, every method at 0.1, and 1.0
EVERYDAY = dict(model="everyday", find_unused_parameters=True)
for method, cls, settings in (
    ("topk", TopK, GATHERED),
    ("rtopk", RTopK, dict(r=0.3, seed=7, **GATHERED)),
    ("threshold", Threshold, GATHERED),
    ("dgc", DGC, dict(momentum=0.9, **GATHERED)),
    ("randomk", RandomK, dict(seed=7, **EVERY)),
    ("random_block", RandomBlock, dict(seed=7, **EVERY)),
    ("topk_spardl", TopK, SCATTERED),
):
    CONFIGS[f"everyday/{method}"] = (named(cls, ratio=0.1, **settings), EVERYDAY)
CONFIGS["everyday/dense"] = (None, EVERYDAY)
CONFIGS["everyday/dgc_no_sync"] = (named(DGC, ratio=0.1, momentum=0.9, **GATHERED), dict(EVERYDAY, passes=2))
CONFIGS["everyday/topk_bucket_view"] = (
    named(TopK, ratio=0.1, **GATHERED),
    dict(EVERYDAY, gradient_as_bucket_view=True),
)
CONFIGS["everyday/topk_1.0"] = (named(TopK, ratio=1.0, dense_fallback=False, **GATHERED), EVERYDAY)


def train(make_compression, options):
    """The parameters after each step, and the compressor (None: DDP's own allreduce)."""
    everyday = options.get("model") == "everyday"
    model = common.torch_everyday_model() if everyday else common.torch_model()
    passes = options.get("passes", 1)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        bucket_cap_mb=options.get("bucket_cap_mb", 25),
        gradient_as_bucket_view=options.get("gradient_as_bucket_view", False),
        find_unused_parameters=options.get("find_unused_parameters", False),
        static_graph=options.get("static_graph", False),
        process_group=options.get("process_group"),
    )
    compression = None if make_compression is None else make_compression(model)
    if compression is not None:
        ddp.register_comm_hook(compression, ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=options.get("momentum", 0))
    history = []
    for step in range(args.steps):
        opt.zero_grad()
        for p in range(passes):  # accumulated locally, exchanged on the last pass
            idx = common.rows(step * passes + p, rank, size, len(y_all))
            branch = dict(branch=common.uses_branch(step, rank)) if everyday else {}
            with ddp.no_sync() if p < passes - 1 else contextlib.nullcontext():
                out = ddp(torch.from_numpy(x_all[idx]), **branch)
                torch.nn.functional.cross_entropy(out, torch.from_numpy(y_all[idx])).backward()
        opt.step()
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return history, compression


results, stats = {}, {}
for config, (make_compression, options) in CONFIGS.items():
    if not args.only or config in args.only:
        results[config], compression = train(make_compression, options)
        stats[config] = None if compression is None else compression.stats()
torch.save({"history": results, "stats": stats}, os.path.join(args.out, f"rank{rank}.pt"))
print(f"rank {rank}/{size}: {len(results)} configs x {args.steps} steps done")
destroy_process_group()
