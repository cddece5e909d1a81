"""Worker (torchrun, Gloo): mixed precision and checkpoints under DistributedDataParallel with
sparsecomm.torch.ddp_hook, for every method of common.loss_scale_configs. SGD with momentum 0.9
(so the optimizer's state is in the checkpoint too), float32, under a torch.amp.GradScaler
(init_scale 2**10, growth every 3 good steps, as PyTorch's AMP recipe runs it under DDP:
scale(loss).backward(), step, update); at step OVERFLOW rank 1 sets one element of its 0.weight
gradient to inf, so the scaler skips that step and halves its scale.

  --mode straight   STEPS scaled steps ("scaled"), and the same compressor and steps without
                    a scaler and without step OVERFLOW ("reference"): they must agree bit for bit;
                    then a third run of the scaled steps up to OVERFLOW (a rollback pending),
                    stopped there: a checkpoint of each rank (model, optimizer, compressor,
                    scaler) in --out
  --mode resume     a fresh process loads its rank's checkpoint and runs the remaining steps
"""

import argparse
import os

import common
import torch
import torch.distributed as dist

import sparsecomm.torch
from sparsecomm.torch import ddp_hook, destroy_process_group

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--mode", choices=["straight", "resume"], required=True)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.set_num_threads(1)
rank, size = dist.get_rank(), dist.get_world_size()
x_all, y_all = common.digits()
STEPS, OVERFLOW, LR = 10, 4, 0.5
CONFIGS = common.loss_scale_configs(sparsecomm.torch)


class Run:
    """A model in DDP with a compressor's hook, its optimizer and (scaled) its GradScaler."""

    def __init__(self, make, scaled):
        self.model = common.torch_model()
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.model)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3) if scaled else None
        self.compression = make(dict(named_parameters=self.model.named_parameters(), loss_scaler=self.scaler))
        self.ddp.register_comm_hook(self.compression, ddp_hook)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=LR, momentum=0.9)
        self.step, self.scales = None, []
        if rank == 1:
            common.poison(self, OVERFLOW)

    def train(self, steps):
        for step in steps:
            self.step = step
            idx = common.rows(step, rank, size, len(y_all))
            self.opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                self.ddp(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])
            )
            if self.scaler is None:
                loss.backward()
                self.opt.step()
                continue
            self.scales.append(self.scaler.get_scale())
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        return self

    def record(self):
        states = self.compression.state.parameters.values()
        return {
            "params": {n: p.detach().clone() for n, p in self.model.named_parameters()},
            "scales": self.scales,
            "steps": {s.name: s.step for s in states},
        }

    def checkpoint(self):
        parts = ("model", "opt", "compression") + (("scaler",) if self.scaler else ())
        return {part: getattr(self, part).state_dict() for part in parts}

    def restore(self, saved):
        for part, state in saved.items():
            getattr(self, part).load_state_dict(state)


checkpoints = os.path.join(args.out, f"checkpoint{rank}.pt")
results, stopped = {}, {}
for config, make in CONFIGS.items():
    if args.mode == "straight":
        results[config] = Run(make, scaled=True).train(range(STEPS)).record()
        reference = Run(make, scaled=False).train(s for s in range(STEPS) if s != OVERFLOW)
        results[config]["reference"] = reference.record()
        stopped[config] = Run(make, scaled=True).train(range(OVERFLOW + 1)).checkpoint()
    else:
        run = Run(make, scaled=True)
        run.restore(torch.load(checkpoints)[config])
        results[config] = run.train(range(OVERFLOW + 1, STEPS)).record()
if stopped:
    torch.save(stopped, checkpoints)
torch.save(results, os.path.join(args.out, f"{args.mode}{rank}.pt"))
print(f"rank {rank}/{size}: {args.mode}, {len(results)} configs")
destroy_process_group()
