"""sparsecomm's compressors between the replicas of FSDP2 (compressed HSDP): FSDP shards the
model over the ranks of a host and reduce-scatters there; the hook all-reduces each shard's
gradient across the replicas (the slow links between hosts), sparsified with error feedback.

    mesh = init_device_mesh("cuda", (hosts, gpus_per_host), mesh_dim_names=("replicate", "shard"))
    for block in model.layers:
        fully_shard(block, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    compression = sct.DGC(ratio=0.001, named_parameters=model.named_parameters())
    sct.register_fsdp_hook(model, compression, mesh["replicate"])

FSDP hands the hook each module's reduce-scatter output: this rank's shard of each of its
parameters, one after the other, each padded to the shard size of the first rank. Each
parameter's shard is one tensor to the compressor (its own k, residual, momentum and step, under
the parameter's name); the padding is never selected nor sent. The shards then go through the DDP
hook's bucket exchange (sparsecomm.torch.ddp.BucketExchange) over the replicas' process group,
and are averaged over the replicas in place (FSDP has averaged over the shard group already).
"""

import io

import torch
import torch.distributed as dist

from .ddp import BucketExchange, attach


def register_fsdp_hook(module, compressor, replicate):
    """Registers `compressor` as the all-reduce hook of every FSDP module of `module` (itself
    included), to exchange their gradient shards across the replicas of `replicate`: a 1-D
    DeviceMesh (``mesh["replicate"]``) or a ProcessGroup. Create the compressor after
    fully_shard, from the sharded model's named_parameters(). Returns the modules hooked."""
    from torch.distributed.fsdp import FSDPModule

    owner = compressor.method.owner
    group = _replicas(owner, replicate)
    hooked = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not hooked:
        raise ValueError(
            f"{owner}: register_fsdp_hook needs a model sharded with torch.distributed.fsdp.fully_shard, "
            f"got a {type(module).__name__} with no FSDP module in it: call "
            "fully_shard(model, mesh=mesh['shard']) first"
        )
    groups = {m: _param_group(owner, m) for m in hooked}
    _check_replicas_agree(owner, module, group)
    ways = attach(compressor, group, "register_fsdp_hook")
    for fsdp_module, param_group in groups.items():
        if param_group is None:  # a module without parameters of its own: FSDP reduces nothing there
            continue
        # Every trainable parameter in the reduce-scatter output on every step (zeros when unused), so
        # that the output's layout is the same on every rank and step.
        fsdp_module.set_reduce_scatter_unused_params(True, recurse=False)
        fsdp_module.set_all_reduce_hook(ShardExchange(compressor, ways, param_group))
    return hooked


def _check_replicas_agree(owner, module, group):
    """Refuses replicas that start from different parameters (one collective): FSDP, unlike DDP,
    does not broadcast them, and the replicas would then train apart without a word."""
    named = [(name, getattr(p, "_local_tensor", p).detach()) for name, p in module.named_parameters()]
    if not named:
        return
    device = named[0][1].device
    mine = torch.stack([torch.stack([t.double().sum(), t.double().square().sum()]) for _, t in named]).to(device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    for other in everyone[1:]:
        differs = (other != everyone[0]).any(dim=1).nonzero()
        if differs.numel():
            raise ValueError(
                f"{owner}: the replicas hold different values of {named[int(differs[0])][0]!r}: FSDP, unlike DDP, "
                "does not broadcast the initial parameters. Initialise them alike on every rank (the same "
                "torch.manual_seed before building the model) or load the same checkpoint before register_fsdp_hook"
            )


def _replicas(owner, replicate):
    """The process group of the replicas: `replicate` itself, or a 1-D DeviceMesh's."""
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(replicate, dist.ProcessGroup):
        return replicate
    if isinstance(replicate, DeviceMesh):
        if replicate.ndim != 1:
            raise ValueError(
                f"{owner}: replicate should be the 1-D mesh of the replicas (mesh['replicate']), got a "
                f"{replicate.ndim}-D DeviceMesh of shape {tuple(replicate.shape)}"
            )
        return replicate.get_group()
    raise TypeError(
        f"{owner}: replicate should be a 1-D DeviceMesh (mesh['replicate']) or a torch.distributed ProcessGroup, "
        f"got {type(replicate).__name__}"
    )


def _param_group(owner, fsdp_module):
    """The module's one FSDP parameter group (None without parameters); refuses what the hook
    cannot serve."""
    groups = fsdp_module._get_fsdp_state()._fsdp_param_groups
    if len(groups) > 1:
        raise ValueError(
            f"{owner}: the FSDP module {type(fsdp_module).__name__} has {len(groups)} parameter groups "
            "(a per-parameter mesh from shard_placement_fn); FSDP's all-reduce hook serves one group per module"
        )
    if not groups:
        return None
    param_group = groups[0]
    if param_group._is_hsdp:
        raise ValueError(
            f"{owner}: {type(fsdp_module).__name__} was sharded over a 2-D mesh: FSDP then all-reduces across "
            "the replicas itself (native HSDP), uncompressed. Give fully_shard the shard dimension only, "
            "fully_shard(module, mesh=mesh['shard']), and the replicas to register_fsdp_hook"
        )
    names = {id(p): name for name, p in fsdp_module.named_parameters()}
    for fsdp_param in param_group.fsdp_params:
        dim = fsdp_param.fsdp_placement.dim
        if dim != 0:
            raise ValueError(
                f"{owner}: {names.get(id(fsdp_param.sharded_param))} is sharded on dim {dim}; "
                "register_fsdp_hook serves FSDP's default Shard(0)"
            )
    return param_group


class ShardExchange:
    """One FSDP module's all-reduce hook: its parameters' shards, exchanged across the replicas."""

    def __init__(self, compressor, ways, param_group):
        self.compressor, self.ways, self.param_group = compressor, ways, param_group

    def __call__(self, reduce_output):
        """Averages `reduce_output` (this rank's shards, padded) over the replicas, in place."""
        exchange = BucketExchange(self.compressor, self.ways)
        # FSDP reads the shards back once the hook returns: the exchange completes here.
        params, shards = self.shards(reduce_output)
        exchange.start(params, shards, reduce_output, is_last=True).wait()

    def shards(self, reduce_output):
        """The trainable parameters with a shard on this rank, and a view of each one's shard."""
        params, shards, offset = [], [], 0
        for fsdp_param in self.param_group.fsdp_params:
            if not fsdp_param.sharded_param.requires_grad:  # frozen: not in the output
                continue
            numel = fsdp_param.sharded_size.numel()
            if numel:  # (a rank past the last row of a small parameter holds none of it)
                view = reduce_output.narrow(0, offset, numel).view(fsdp_param.sharded_size)
                params.append(fsdp_param.sharded_param)
                shards.append(view)
            offset += fsdp_param.padded_sharded_param_size.numel()
        if offset != reduce_output.numel():
            raise RuntimeError(
                f"{self.compressor.method.owner}: FSDP's reduce-scatter output has {reduce_output.numel()} elements, "
                f"the module's trainable parameters' padded shards {offset}: was set_reduce_scatter_unused_params "
                "turned off after register_fsdp_hook?"
            )
        return params, shards


class PerRankState:
    """A compressor's state for torch.distributed.checkpoint (DCP), beside the model's:

        state = {"model": model_state, "optim": optim_state, "compression": sct.PerRankState(compression)}
        dcp.save(state, checkpoint_id=path)   # ... and later, on the same ranks: dcp.load(state, ...)

    Residuals and momenta differ on every rank (each rank's error feedback is its own), so each
    rank saves its state under its own key, as one serialized item; a load restores it on the
    rank of the same number, which must hold the same shards (the same world and mesh)."""

    def __init__(self, compressor):
        self.compressor = compressor

    def _key(self):
        return f"rank{dist.get_rank()}"

    def state_dict(self):
        buffer = io.BytesIO()
        torch.save(self.compressor.state_dict(), buffer)
        buffer.seek(0)
        return {self._key(): buffer}

    def load_state_dict(self, state):
        buffer = state[self._key()]
        buffer.seek(0)
        self.compressor.load_state_dict(torch.load(buffer, weights_only=False))
