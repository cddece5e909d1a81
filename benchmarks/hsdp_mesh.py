"""What the compressed-HSDP workers (hsdp_worker.py, hsdp_convergence_worker.py) set up and end
alike: the 2-D mesh of replicas and shards, the model sharded layer by layer, the records saved."""

import json

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def replica_mesh(per_host):
    """The ("replicate", "shard") mesh of the world's ranks: a host of `per_host` ranks a replica."""
    size = dist.get_world_size()
    return init_device_mesh("cpu", (size // per_host, per_host), mesh_dim_names=("replicate", "shard"))


def shard_layers(model, mesh):
    """`model` with each layer that has parameters, and the root, sharded over `mesh` (in place)."""
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def save_records(records, out, destroy):
    """Ends the process group (`destroy`: sparsecomm's destroy_process_group), then rank 0 writes
    `records` to `out` as JSON."""
    rank = dist.get_rank()
    destroy()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(records, f, indent=1)
