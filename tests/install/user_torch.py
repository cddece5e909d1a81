"""A user's 2-rank training script, as the README writes it: DGC under stock
hvd.DistributedOptimizer, run in a fresh environment where sparsecomm was installed from its
sdist. Prints "in sync" when every rank ends with bitwise equal parameters, the loss went down
and fewer bytes went out than a dense allreduce would send."""

import horovod.torch as hvd
import torch

import sparsecomm
import sparsecomm.torch as sct

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
compression = sct.DGC(
    ratio=0.01,
    momentum=0.9,
    exchange="allgather",  # auto may pick dense on loopback
    named_parameters=model.named_parameters(),
)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), compression=compression
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

data = torch.Generator().manual_seed(1)
x = torch.randn(512, 64, generator=data)
y = (x @ torch.randn(64, 10, generator=data)).argmax(1)
loss = torch.nn.functional.cross_entropy
before = loss(model(x), y).item()
for step in range(30):
    rows = slice((step * hvd.size() + hvd.rank()) * 16 % 512, None)
    opt.zero_grad()
    loss(model(x[rows][:16]), y[rows][:16]).backward()
    opt.step()
after = loss(model(x), y).item()

flat = torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], dim=1)
everyone = hvd.allgather(flat, name="user.params")
stats = compression.stats()
assert all(torch.equal(everyone[0], row) for row in everyone[1:]), "ranks differ"
assert after < before, f"loss {before} -> {after}"
assert stats["sent_bytes"] < stats["dense_bytes"] / 10, stats
print(
    f"rank {hvd.rank()}: sparsecomm {sparsecomm.__version__} from {sparsecomm.__file__}: in sync, "
    f"loss {before:.3f} -> {after:.3f}, sent {stats['sent_bytes']} of {stats['dense_bytes']} dense bytes",
    flush=True,
)
