"""Worker (torchrun, Gloo, CPU): docs/ddp.md's recipes inside training frameworks ("Inside
training frameworks"), as written there: PyTorch Lightning (a Callback registers the hook on the
DistributedDataParallel the strategy built) or Hugging Face Accelerate (the hook registered on the
prepared model). ddp_train.py's model, rows, steps and plain SGD, so that every configuration can
be compared with the single-process simulation. Every rank checks that the hook ran on every
parameter at every step and that the ranks' parameters are equal bit for bit, then saves its
parameters after every step and each compressor's stats."""

import os

import common
import torch
import torch.distributed as dist
from common import EVERY

import sparsecomm.torch as sct

parser = common.worker_parser(steps=5, lr=0.5)
parser.add_argument("framework", choices=["lightning", "accelerate"])
args = parser.parse_args()
torch.set_num_threads(1)

GATHERED = dict(exchange="allgather", **EVERY)
# name -> the compressor for the model (None: the framework's DDP with its own allreduce)
CONFIGS = {
    "dense": None,
    "topk_0.1": lambda model: sct.TopK(ratio=0.1, named_parameters=model.named_parameters(), **GATHERED),
    "dgc_0.1": lambda model: sct.DGC(ratio=0.1, momentum=0.9, named_parameters=model.named_parameters(), **GATHERED),
    "topk_1.0": lambda model: sct.TopK(
        ratio=1.0, dense_fallback=False, named_parameters=model.named_parameters(), **GATHERED
    ),
}


def batches(rank, size):
    """This rank's rows at every step, in step order (ddp_train.py's): a DataLoader of one batch a step."""
    x_all, y_all = common.digits()
    idx = [i for step in range(args.steps) for i in common.rows(step, rank, size, len(y_all))]
    data = torch.utils.data.TensorDataset(torch.from_numpy(x_all[idx]), torch.from_numpy(y_all[idx]))
    return torch.utils.data.DataLoader(data, batch_size=common.BATCH, shuffle=False)


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def lightning_runs():
    """Lightning's Trainer under torchrun (its TorchElasticEnvironment): the recipe's Callback, and
    DDPStrategy's own ddp_comm_hook argument, which Lightning registers on CUDA devices only."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from torch.nn.parallel import DistributedDataParallel

    class SparseCommHook(pl.Callback):
        """docs/ddp.md's recipe: the hook on the DDP the strategy built, on CPU and GPU alike."""

        def __init__(self, compression):
            self.compression = compression

        def on_fit_start(self, trainer, pl_module):
            if isinstance(trainer.strategy.model, DistributedDataParallel):
                trainer.strategy.model.register_comm_hook(self.compression, sct.ddp_hook)

    class Classifier(pl.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=args.lr)  # DGC keeps the momentum: plain SGD

    class Record(pl.Callback):
        def __init__(self, net):
            self.net, self.history = net, []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.history.append(snapshot(self.net))

    def fit(make, strategy_args=False):
        net = common.torch_model()
        compression = make(net) if make else None
        record = Record(net)
        callbacks = [record]
        if compression is not None and strategy_args:  # Lightning's own way: CUDA only
            strategy = pl.strategies.DDPStrategy(ddp_comm_state=compression, ddp_comm_hook=sct.ddp_hook)
        else:
            strategy = "ddp"
            if compression is not None:
                callbacks.append(SparseCommHook(compression))
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=int(os.environ["LOCAL_WORLD_SIZE"]),
            strategy=strategy,
            max_steps=args.steps,
            callbacks=callbacks,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            use_distributed_sampler=False,  # each rank's own rows (batches())
        )
        # the ranks torchrun gave: fit starts the process group
        rows = batches(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        trainer.fit(Classifier(net), train_dataloaders=rows)
        assert isinstance(trainer.strategy.model, pl.LightningModule)  # unwrapped again by teardown
        return record.history, compression

    runs = {name: fit(make) for name, make in CONFIGS.items()}
    runs["topk_0.1_strategy_args"] = fit(CONFIGS["topk_0.1"], strategy_args=True)
    return runs


def accelerate_runs():
    """Accelerate under torchrun: with cpu=True it starts a Gloo process group (MULTI_CPU) and
    prepare() wraps the model in DDP. Without it, on a machine without a GPU, each rank trains
    alone (DistributedType.NO) and prepare() returns the model unwrapped."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from torch.nn.parallel import DistributedDataParallel

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    assert accelerator.distributed_type == DistributedType.MULTI_CPU, accelerator.distributed_type
    assert dist.get_backend() == "gloo", dist.get_backend()

    def train(make):
        net = common.torch_model()
        compression = make(net) if make else None
        opt = torch.optim.SGD(net.parameters(), lr=args.lr)  # DGC keeps the momentum: plain SGD
        model, opt = accelerator.prepare(net, opt)
        assert isinstance(model, DistributedDataParallel), type(model)
        if compression is not None:
            model.register_comm_hook(compression, sct.ddp_hook)
        history = []
        for x, y in batches(accelerator.process_index, accelerator.num_processes):
            opt.zero_grad()
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            opt.step()
            history.append(snapshot(accelerator.unwrap_model(model)))
        return history, compression

    runs = {name: train(make) for name, make in CONFIGS.items()}
    return runs, accelerator


def check(runs):
    """On every rank: each compressor's hook ran on each of the model's 4 parameters at every step
    (Lightning's ddp_comm_hook argument never, on CPU), and the ranks' last parameters are equal."""
    for name, (history, compression) in runs.items():
        assert len(history) == args.steps, (name, len(history))
        if compression is not None:
            calls = compression.stats()["calls"]
            want = 0 if name.endswith("_strategy_args") else args.steps * len(history[-1])
            if calls != want:
                raise AssertionError(f"{name}: the hook compressed {calls} tensors, not {want}")
        mine = torch.cat([p.reshape(-1) for p in history[-1].values()])
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        for rank, theirs in enumerate(every):
            if not torch.equal(theirs, mine):
                raise AssertionError(f"{name}: rank {rank}'s parameters differ from rank {dist.get_rank()}'s")


def main():
    if args.framework == "lightning":
        runs, accelerator = lightning_runs(), None
    else:
        runs, accelerator = accelerate_runs()
    check(runs)
    rank = dist.get_rank()
    torch.save(
        {
            "history": {name: history for name, (history, _) in runs.items()},
            "stats": {name: None if c is None else c.stats() for name, (_, c) in runs.items()},
        },
        os.path.join(args.out, f"rank{rank}.pt"),
    )
    print(f"rank {rank}/{dist.get_world_size()}: {args.framework}, {len(runs)} runs x {args.steps} steps checked")
    sct.destroy_process_group()  # docs/ddp.md, "Ending the job"
    if accelerator is not None:
        accelerator.end_training()  # its process group already destroyed: nothing left to do


if __name__ == "__main__":
    main()
