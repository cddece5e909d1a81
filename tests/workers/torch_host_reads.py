"""Worker (2 ranks under horovodrun): every host read of tensor data (item, float(), int(),
bool(), tolist, numpy) that a compress + decompress makes, per compressor configuration, with
the innermost sparsecomm function that made it. Saves {config: [(read, "file:function"), ...]}
for the steps after the first (the first step also runs the one-off settings check). The
configurations under a GradScaler change its scale between steps, as scaler.update() does."""

import json
import os

import common
import horovod.torch as hvd
import torch
from common import EVERY
from host_reads import HostReads

import sparsecomm.torch
from sparsecomm.torch import DGC, Threshold

args = common.worker_parser().parse_args()
hvd.init()
x_all, y_all = common.digits()
named = lambda m: dict(named_parameters=m.named_parameters(), **EVERY)  # noqa: E731
CONFIGS = {
    **common.hot_path_compressors(sparsecomm.torch, 0.05),
    "DGC_loss_scaled": lambda m: DGC(ratio=0.05, exchange="allgather", loss_scaler=scaler, **named(m)),
    "Threshold_loss_scaled": lambda m: Threshold(ratio=0.05, exchange="allgather", loss_scaler=scaler, **named(m)),
}
results = {}
for config, make in CONFIGS.items():
    model = common.torch_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if "loss_scaled" in config else None
    compression = make(model)
    mode = HostReads()
    for step in range(3):
        model.zero_grad()
        idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx]))
        if scaler is not None:
            if step:  # a new scale, as scaler.update() sets between steps
                scaler.update(new_scale=2.0 ** (10 + step))
            loss = scaler.scale(loss)
        loss.backward()
        params = list(model.parameters())
        if step == 0:  # the settings check runs once, on the first step: not the hot path
            handed = [compression.compress(p.grad) for p in params]
            for i, (tensor, ctx) in enumerate(handed):
                compression.decompress(hvd.allreduce(tensor, name=f"{config}.{step}.{i}"), ctx)
            continue
        with mode:  # Horovod's own allreduce is outside the mode: only compress and decompress count
            handed = [compression.compress(p.grad) for p in params]
        outputs = [hvd.allreduce(tensor, name=f"{config}.{step}.{i}") for i, (tensor, _) in enumerate(handed)]
        with mode:
            for output, (_, ctx) in zip(outputs, handed):
                compression.decompress(output, ctx)
    results[config] = {"tensors": len(list(model.parameters())), "steps": 2, "reads": mode.reads}
with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(results, f)
