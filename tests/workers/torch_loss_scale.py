"""Worker: mixed precision (loss_scaler=) with every method. Per config:

- "scaled": 10 float32 SGD steps under a torch.amp.GradScaler (init_scale 2**10, growth every
  3 good steps) with Horovod's synchronize()/skip_synchronize() recipe; at step OVERFLOW, rank 1
  sets one element of its 0.weight gradient to inf (rank 0's gradients stay finite), so the
  scaler skips that step and halves its scale. The scale goes 2**10, 2**11 (growth), back to
  2**10 (overflow), 2**11 (growth).
- "reference": the same compressor and steps without any scaler, and without step OVERFLOW
  (its batch skipped). Powers of two scale exactly: the two must match bit for bit.
- "resumed": the scaled run, checkpointed (model, compressor, scaler) and rebuilt from the
  checkpoint after step 2 (a growth is pending) and after step OVERFLOW (a rollback is pending).
- "bf16": 40 steps under torch.autocast("cpu", dtype=torch.bfloat16) with a default GradScaler:
  the losses and whether the residuals and momenta stayed finite.
"""

import io
import os

import common
import horovod.torch as hvd
import torch

import sparsecomm.torch

args = common.worker_parser().parse_args()
common.start_torch()
x_all, y_all = common.digits()
STEPS, OVERFLOW, LR = 10, 4, 0.5
CONFIGS = common.loss_scale_configs(sparsecomm.torch)


class Run:
    """A model, its compressor and Horovod optimizer, and (scaled) its GradScaler."""

    def __init__(self, make, scaled, init_scale=2.0**10, growth_interval=3):
        self.model = common.torch_model()
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.scaler = (
            torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval) if scaled else None
        )
        self.compression = make(dict(named_parameters=self.model.named_parameters(), loss_scaler=self.scaler))
        self.opt = hvd.DistributedOptimizer(
            torch.optim.SGD(self.model.parameters(), lr=LR),
            named_parameters=self.model.named_parameters(),
            compression=self.compression,
        )
        self.step = None
        if hvd.rank() == 1:  # the forced overflow: one inf in one gradient of one rank
            common.poison(self, OVERFLOW)

    def train(self, steps, autocast=False):
        losses = []
        for step in steps:
            self.step = step
            idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
            self.opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = torch.nn.functional.cross_entropy(
                    self.model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])
                )
            losses.append(float(loss.detach()))
            if self.scaler is None:
                loss.backward()
                self.opt.step()
                continue
            self.scaler.scale(loss).backward()
            self.opt.synchronize()
            self.scaler.unscale_(self.opt)
            with self.opt.skip_synchronize():
                self.scaler.step(self.opt)
            self.scaler.update()
        return losses

    def params(self):
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def checkpoint(self):
        buffer = io.BytesIO()
        torch.save(
            {
                "model": self.model.state_dict(),
                "compression": self.compression.state_dict(),
                "scaler": self.scaler.state_dict(),
            },
            buffer,
        )
        buffer.seek(0)
        return torch.load(buffer)

    def restore(self, saved):
        self.model.load_state_dict(saved["model"])
        self.compression.load_state_dict(saved["compression"])
        self.scaler.load_state_dict(saved["scaler"])


results = {}
for config, make in CONFIGS.items():
    scaled, scales = Run(make, scaled=True), []
    for step in range(STEPS):
        scales.append(scaled.scaler.get_scale())
        scaled.train([step])
    states = scaled.compression.state.parameters.values()
    results[config] = {
        "scaled": scaled.params(),
        "scales": scales,
        "steps": {s.name: s.step for s in states},
        "loss_scales": {s.name: s.loss_scale for s in states},
    }

    reference = Run(make, scaled=False)
    reference.train([s for s in range(STEPS) if s != OVERFLOW])
    results[config]["reference"] = reference.params()
    results[config]["reference_steps"] = {s.name: s.step for s in reference.compression.state.parameters.values()}

    run = Run(make, scaled=True)
    for steps in (range(0, 3), range(3, OVERFLOW + 1), range(OVERFLOW + 1, STEPS)):
        if steps.start:
            saved = run.checkpoint()
            run = Run(make, scaled=True)  # a fresh start, as after a restart
            run.restore(saved)
        run.train(steps)
    results[config]["resumed"] = run.params()

    smoke = Run(make, scaled=True, init_scale=2.0**16, growth_interval=2000)
    results[config]["bf16_losses"] = smoke.train(range(40), autocast=True)
    results[config]["bf16_finite"] = all(
        bool(torch.isfinite(t).all())
        for s in smoke.compression.state.parameters.values()
        for t in (s.residual, s.momentum)
        if t is not None
    )
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
