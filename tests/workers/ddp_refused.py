"""Worker (torchrun, Gloo): a DDP step whose hook must refuse, on every rank. Each rank prints
what its backward raised ("rank R refused: ...") and exits 3; a rank that steps prints
"rank R stepped" and exits 0.

  --case mismatch   rank 1's compressor has another ratio than rank 0's (a settings mismatch)
  --case sparse     a model with a sparse embedding gradient (nn.EmbeddingBag(sparse=True))
"""

import argparse
import sys

import common
import torch
import torch.distributed as dist

from sparsecomm.torch import TopK, ddp_hook, destroy_process_group

parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=["mismatch", "sparse"], required=True)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()

if args.case == "mismatch":
    model = common.torch_model()
    x_all, _ = common.digits()
    x = torch.from_numpy(x_all[:8])
    ratio = 0.1 if rank == 0 else 0.2
else:
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 8, sparse=True), torch.nn.Linear(8, 2))
    x, ratio = torch.tensor([[1, 2], [3, 4]]), 0.1
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp.register_comm_hook(TopK(ratio=ratio, named_parameters=model.named_parameters()), ddp_hook)
try:
    ddp(x).sum().backward()
except Exception as error:  # what DDP raised from the hook
    print(f"rank {rank} refused: {error}", flush=True)
    sys.exit(3)
print(f"rank {rank} stepped", flush=True)
destroy_process_group()
