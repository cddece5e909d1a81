"""sparsecomm.torch.register_fsdp_hook in one process (a Gloo group of one rank): the hook on
every FSDP module, a step at ratio 1 equal to plain SGD, and what it refuses, each with an error
that names the argument. Several ranks: tests/multirank/test_fsdp.py."""

import common
import pytest
import torch
import torch.distributed as dist
from launch import free_port
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Shard

import sparsecomm.torch as sct


@pytest.fixture
def mesh():
    """A 1 x 1 mesh of replicas and shards over a one-rank Gloo group."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    sct.destroy_process_group()


def sharded(mesh_or_dim):
    model = common.torch_frozen_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh_or_dim)
    fully_shard(model, mesh=mesh_or_dim)
    return model


def sgd_step(model, lr=0.5):
    x, y = common.digits()
    torch.nn.functional.cross_entropy(model(torch.from_numpy(x[:16])), torch.from_numpy(y[:16])).backward()
    torch.optim.SGD(model.parameters(), lr=lr).step()
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("exchange", ["allgather", "spardl"])
def test_at_ratio_one_on_one_replica_the_step_is_plain_sgd_and_every_module_is_hooked(mesh, exchange):
    plain = sgd_step(sharded(mesh["shard"]))
    model = sharded(mesh["shard"])
    compression = sct.TopK(
        ratio=1.0, exchange=exchange, dense_fallback=False, min_numel=0, named_parameters=model.named_parameters()
    )
    hooked = sct.register_fsdp_hook(model, compression, mesh["replicate"])
    assert len(hooked) == 4 and all(isinstance(m, FSDPModule) for m in hooked)  # the 3 layers and the root
    after = sgd_step(model)
    for name, want in plain.items():
        assert torch.equal(after[name], want), name
    tensors = compression.stats()["tensors"]
    assert sorted(tensors) == ["2.bias", "2.weight", "4.bias", "4.weight"]  # the frozen layer's are not sent


def test_a_process_group_serves_as_the_replicas(mesh):
    model = sharded(mesh["shard"])
    compression = sct.TopK(ratio=0.5, exchange="allgather", named_parameters=model.named_parameters())
    sct.register_fsdp_hook(model, compression, mesh["replicate"].get_group())
    sgd_step(model)
    assert compression.stats()["calls"] == 4


def test_a_model_without_fully_shard_is_refused(mesh):
    model = common.torch_model()
    compression = sct.TopK(ratio=0.1, named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match=r"TopK: register_fsdp_hook needs a model sharded with .*fully_shard"):
        sct.register_fsdp_hook(model, compression, mesh["replicate"])


def test_native_hsdp_on_a_2d_mesh_is_refused(mesh):
    model = sharded(mesh)
    compression = sct.DGC(ratio=0.1, named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match=r"DGC: .* was sharded over a 2-D mesh: .*native HSDP.*mesh\['shard'\]"):
        sct.register_fsdp_hook(model, compression, mesh["replicate"])


@pytest.mark.parametrize(
    "replicate, error, match",
    [
        ("mesh", ValueError, r"replicate should be the 1-D mesh of the replicas .*got a 2-D DeviceMesh"),
        ("name", TypeError, r"replicate should be a 1-D DeviceMesh .* or a torch.distributed ProcessGroup, got str"),
    ],
)
def test_a_wrong_replicate_is_refused(mesh, replicate, error, match):
    model = sharded(mesh["shard"])
    compression = sct.TopK(ratio=0.1, named_parameters=model.named_parameters())
    with pytest.raises(error, match=match):
        sct.register_fsdp_hook(model, compression, mesh if replicate == "mesh" else "replicate")


def test_a_compressor_made_before_fully_shard_is_refused_at_the_first_step(mesh):
    model = common.torch_frozen_model()
    compression = sct.TopK(ratio=0.1, named_parameters=model.named_parameters())  # the unsharded parameters
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    sct.register_fsdp_hook(model, compression, mesh["replicate"])
    refused = r"TopK: a parameter of shape .* is not among the named_parameters=.*fully_shard"
    with pytest.raises(LookupError, match=refused):
        sgd_step(model)


def test_the_hierarchical_exchange_is_refused(mesh):
    model = sharded(mesh["shard"])
    compression = sct.TopK(ratio=0.1, exchange="hierarchical", named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match=r"exchange='hierarchical' .* not under register_fsdp_hook"):
        sct.register_fsdp_hook(model, compression, mesh["replicate"])


def test_a_parameter_sharded_on_another_dim_is_refused(mesh):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    fully_shard(model, mesh=mesh["shard"], shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else None)
    compression = sct.TopK(ratio=0.1, named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match=r"TopK: 0.weight is sharded on dim 1; register_fsdp_hook serves .*Shard\(0\)"):
        sct.register_fsdp_hook(model, compression, mesh["replicate"])


def test_several_parameter_groups_in_a_module_are_refused(mesh):
    """A per-parameter mesh (shard_placement_fn's ShardPlacementResult) makes a second group."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, ShardPlacementResult

    other = FSDPMeshInfo(DeviceMesh.from_group(dist.new_group([0]), "cpu", mesh_dim_names=("other",)), shard_mesh_dim=0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    fully_shard(
        model,
        mesh=mesh["shard"],
        shard_placement_fn=lambda p: ShardPlacementResult(Shard(0), other) if p.ndim == 1 else None,
    )
    compression = sct.TopK(ratio=0.1, named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match=r"TopK: the FSDP module FSDPSequential has 2 parameter groups"):
        sct.register_fsdp_hook(model, compression, mesh["replicate"])
