"""Worker: exchange="hierarchical" without the hosts' process sets registered at hvd.init, and
with a process set of some ranks: every rank gets the same clear error on its first step, before
any of the exchange's collectives starts (no hang)."""

import common
import horovod.torch as hvd
import torch

from sparsecomm.torch import TopK

some = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[some])
x_all, y_all = common.digits()
for process_set in (some, None):
    model = common.torch_model()
    named = list(model.named_parameters())
    compression = TopK(  # on every rank: the ranks number their compressors alike (the settings check's name)
        ratio=0.1, exchange="hierarchical", process_set=process_set, named_parameters=named, **common.EVERY
    )
    if process_set is some and not some.included():
        continue
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=named,
        compression=compression,
        process_set=process_set or hvd.global_process_set,
    )
    idx = common.rows(0, hvd.rank(), hvd.size(), len(y_all))
    try:
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        opt.step()
        print(f"rank {hvd.rank()}: trained")
    except (RuntimeError, ValueError) as error:
        print(f"rank {hvd.rank()}: {type(error).__name__}: {error}")
