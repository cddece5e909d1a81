"""Worker: ranks construct compressors with different settings; every rank must get the same
clear error on the first step (no hang), and equal settings must train normally."""
import horovod.torch as hvd
import torch

import common
from sparsecomm.torch import TopK

hvd.init()
x_all, y_all = common.digits()
for ratio_of in (lambda rank: 0.1, lambda rank: 0.1 if rank == 0 else 0.2):
    model = common.torch_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=TopK(exchange="allgather", ratio=ratio_of(hvd.rank()), named_parameters=model.named_parameters()))
    idx = common.rows(0, hvd.rank(), hvd.size(), len(y_all))
    try:
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        opt.step()
        print(f"rank {hvd.rank()}: trained")
    except ValueError as error:
        print(f"rank {hvd.rank()}: ValueError: {error}")
