"""Compressed HSDP in one process, in plain torch: what tests/workers/fsdp_train.py's ranks
compute, R replicas of S shards. Per step, each rank's gradients of its rows
(simulated_training.rank_gradients, global rank r * S + s); inside each replica their average
(FSDP's reduce-scatter); each parameter cut into S shards of rows as FSDP cuts it (ceil(rows / S)
rows a shard, the last ones short or empty); each shard's replicas through the method's selection
(simulation.py, per replica's residual and momentum), summed in replica order and averaged over
the replicas; plain SGD on the whole."""

import copy
import math

import simulation
import torch
from simulated_training import rank_gradients, summed, trained


def shard_rows(rows, shards):
    """FSDP's Shard(0): (first row, end) of each shard."""
    per = math.ceil(rows / shards)
    return [(min(s * per, rows), min((s + 1) * per, rows)) for s in range(shards)]


def simulate_hsdp(
    replicas,
    make_model,
    steps,
    lr,
    method=None,
    ratio=None,
    shards=2,
    seed=7,
    exchange="allgather",
    dgc=None,
    dense_names=(),
    passes=1,
    compute_dtype=None,
    sgd_momentum=0.0,
    reduce_dtype=torch.float32,
    clip_norm=None,
    forward=None,
):
    """The full parameters after each step. method: a simulation.METHODS name, or None with dgc
    (simulation.dgc's momentum) or neither (native HSDP: the dense average). dense_names: the
    parameters the policy sends dense. compute_dtype: the forward and backward's (bf16 mixed
    precision), the gradients reduced in `reduce_dtype`. sgd_momentum: torch.optim.SGD's.
    clip_norm: DGC's, each shard clipped to clip_norm / sqrt(replicas). forward: as
    simulated_training.rank_gradients' (a parameter a rank leaves unused: its zeros averaged in)."""
    clip_limit = None if clip_norm is None else clip_norm / math.sqrt(replicas)
    dgc_settings = None if dgc is None else (dgc, clip_limit)
    model, size = make_model(), replicas * shards
    state = {}  # (replica, shard, name) -> residual, or DGC's (residual, momentum)
    buffers = {}  # SGD's momentum
    history = []
    for step in range(steps):
        grads = [_gradients(model, step, rank, size, passes, compute_dtype, forward) for rank in range(size)]
        with torch.no_grad():
            for name, p in trained(model):
                group = [{name: g[name].to(reduce_dtype)} for g in grads]
                averaged = [_shard_average(group[r * shards : (r + 1) * shards], name) for r in range(replicas)]
                update = torch.empty_like(p)
                for s, (first, end) in enumerate(shard_rows(p.shape[0], shards)):
                    if first == end:
                        continue
                    sent = []
                    for r in range(replicas):
                        grad = averaged[r][first:end].reshape(-1)
                        dense = name in dense_names
                        key = (r, s, name)
                        sent.append(_selected(state, key, grad, method, ratio, dgc_settings, dense, step, seed, r))
                    residuals = [_residual(state.get((r, s, name))) for r in range(replicas)]
                    total = sent[0] if replicas == 1 else summed(sent, residuals, ratio, exchange)
                    average = (total / replicas).to(reduce_dtype)  # written back in the reduce dtype
                    update[first:end] = average.view(update[first:end].shape)
                if sgd_momentum:  # torch.optim.SGD: buf = m * buf + update (the first step: buf = update)
                    buffers[name] = update.clone() if step == 0 else sgd_momentum * buffers[name] + update
                    update = buffers[name]
                p.add_(update, alpha=-lr)
        history.append({n: q.detach().clone() for n, q in model.named_parameters()})
    return history


def _gradients(model, step, rank, size, passes, compute_dtype, forward):
    if compute_dtype is None:
        return rank_gradients(model, step, rank, size, passes, forward=forward)
    low = copy.deepcopy(model).to(compute_dtype)  # FSDP's cast for the forward and backward
    grads = rank_gradients(low, step, rank, size, passes, dtype=compute_dtype, forward=forward)
    return {name: g.float() for name, g in grads.items()}


def _shard_average(grads, name):
    """The reduce-scatter's average of `name`'s gradients over a shard group (its ranks in order)."""
    return sum((g[name] for g in grads[1:]), grads[0][name]) / len(grads)


def _residual(entry):
    return entry[0] if isinstance(entry, tuple) else entry


def _selected(state, key, grad, method, ratio, dgc, dense, step, seed, replica):
    """What one replica sends of one shard (dense float32), its state updated. dgc: (momentum,
    clip limit) or None."""
    if dgc is not None:
        momentum, clip_limit = dgc
        zeros = (torch.zeros(grad.numel()), torch.zeros(grad.numel()))
        sent, state[key] = simulation.dgc(
            grad, state.get(key, zeros), ratio, key[2], step, momentum, clip_limit=clip_limit, dense=dense
        )
        return sent
    if method is None or dense:
        return grad.float()
    residual = state.get(key, torch.zeros(grad.numel()))
    sent, state[key] = simulation.METHODS[method](
        grad, residual, ratio, key[2], step, simulation.seed_for(method, seed, replica)
    )
    return sent
