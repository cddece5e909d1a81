"""Worker (2 ranks under horovodrun): every tensor that compress and decompress allocate, per
compressor configuration, after warm-up, recorded with a TorchDispatchMode (an op's output
whose storage is none of its inputs' is new). Saves per config, for the timed steps: the
largest new tensor of any one call in bytes and its op, the gradient's dense bytes, and whether every
decompress returned the gradient buffer that compress received."""

import json
import os

import common
import horovod.torch as hvd
import torch
from common import EVERY
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import sparsecomm.torch
from sparsecomm.torch import DGC, Threshold

WARMUP, STEPS = 3, 10


class Allocations(TorchDispatchMode):
    """The size in bytes of every new storage an op returns."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.sizes.append((str(func), t.untyped_storage().nbytes()))
        return out


args = common.worker_parser().parse_args()
hvd.init()
named = lambda m: dict(named_parameters=m.named_parameters(), **EVERY)  # noqa: E731
CONFIGS = {
    **common.hot_path_compressors(sparsecomm.torch, 0.01),
    "Threshold_fp16": lambda m: Threshold(ratio=0.01, quantize="fp16", exchange="allgather", **named(m)),
    # 16-bit gradients: the clipping norm reads them as they are (no float32 copy), both routes
    "DGC_allgather_clipped_bfloat16": lambda m: DGC(ratio=0.01, clip_norm=1e-3, exchange="allgather", **named(m)),
    "DGC_dense_clipped_float16": lambda m: DGC(ratio=0.01, clip_norm=1e-3, dense=["*"], **named(m)),
    "DGC_dense": lambda m: DGC(ratio=0.01, dense=["*"], **named(m)),  # momentum SGD, routed dense
}
DTYPES = {"DGC_allgather_clipped_bfloat16": torch.bfloat16, "DGC_dense_clipped_float16": torch.float16}
results = {}
for config, make in CONFIGS.items():
    torch.manual_seed(hvd.rank())
    dtype = DTYPES.get(config, torch.float32)
    model = torch.nn.Linear(512, 256, bias=False).to(dtype)  # one 131,072-element gradient
    compression = make(model)
    largest, largest_op, in_place = 0, None, True
    for step in range(WARMUP + STEPS):
        model.zero_grad()
        model(torch.randn(16, 512, dtype=dtype)).square().mean().backward()
        grad = model.weight.grad
        mode = Allocations()
        with mode:
            tensor, ctx = compression.compress(grad)
        output = hvd.allreduce_(tensor, name=f"{config}.{step}")  # in place, as the optimizer; not counted
        with mode:
            result = compression.decompress(output, ctx)
        if step >= WARMUP:
            for op, size in mode.sizes:
                if size > largest:
                    largest, largest_op = size, op
            in_place &= result.data_ptr() == grad.data_ptr()
    results[config] = {
        "largest_bytes": largest,
        "largest_op": largest_op,
        "dense_bytes": grad.numel() * grad.element_size(),
        "in_place": in_place,
    }
with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(results, f)
