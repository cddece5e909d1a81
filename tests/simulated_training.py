"""N ranks of the workers' training in one process, in plain torch: the same model, rows and
steps as tests/workers/torch_train.py, each rank's selection by simulation.py, summed over
ranks as Horovod does, then SGD. What the multi-rank torch tests compare every rank with."""

import common
import reference
import simulation
import torch
from simulation import METHODS, dgc_density

STEPS, LR = 5, 0.5


def simulate_dgc(
    size,
    ratio,
    momentum=0.9,
    masking=True,
    warmup_steps=0,
    stages=4,
    clip_norm=None,
    dense_names=(),
    dense_fallback=True,
    steps=STEPS,
    lr=LR,
    make_model=common.torch_model,
    forward=None,
    passes=1,
    exchange="allgather",
    nesterov=False,
):
    """DGC on N ranks, plain torch (simulation.dgc per rank and tensor), summed over the ranks
    as `exchange` does, then plain SGD. A tensor in dense_names, or at a density where the
    sparse payload would not be smaller (dense_fallback), gets momentum SGD."""
    model = make_model()
    state = [
        {n: (torch.zeros(p.numel()), torch.zeros(p.numel())) for n, p in model.named_parameters()} for _ in range(size)
    ]
    history = []
    for step in range(steps):
        grads = [rank_gradients(model, step, rank, size, passes, forward=forward) for rank in range(size)]
        density = dgc_density(ratio, step, warmup_steps, stages)
        with torch.no_grad():
            for name, p in trained(model):
                dense = name in dense_names or (dense_fallback and reference.sparse_is_larger(density, p.numel()))
                sent = []
                for rank in range(size):
                    rank_sent, state[rank][name] = simulation.dgc(
                        grads[rank][name],
                        state[rank][name],
                        density,
                        name,
                        step,
                        momentum,
                        masking,
                        None if clip_norm is None else clip_norm / size**0.5,
                        dense,
                        nesterov,
                    )
                    sent.append(rank_sent)
                residuals = [state[rank][name][0] for rank in range(size)]
                total = summed(sent, residuals, density, exchange if not dense else "allgather")
                p -= lr * (total / size).view(p.shape)
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return history


def rank_gradients(model, step, rank, size, passes=1, dtype=torch.float32, forward=None):
    """What Horovod hands rank `rank`'s compressor at `step`, by parameter name: the gradients
    of its rows (accumulated over `passes` backward passes, as in the workers; a sparse one
    densified), zeros for a parameter that got none (Horovod submits zeros for it). `forward(model,
    x, step, rank)` runs the model (default: model(x))."""
    x_all, y_all = common.digits()
    forward = forward or (lambda model, x, step, rank: model(x))
    model.zero_grad()
    for p in range(passes):
        idx = common.rows(step * passes + p, rank, size, len(y_all))
        torch.nn.functional.cross_entropy(
            forward(model, torch.from_numpy(x_all[idx]).to(dtype), step, rank).float(), torch.from_numpy(y_all[idx])
        ).backward()
    return {
        n: p.grad.to_dense()
        if p.grad is not None and p.grad.is_sparse
        else p.grad.clone()
        if p.grad is not None
        else torch.zeros_like(p)
        for n, p in trained(model)
    }


def trained(model):
    """The (name, parameter) pairs Horovod reduces: those that require a gradient."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def simulate(
    size,
    method=None,
    ratio=None,
    seed=7,
    op="average",
    error_feedback=True,
    momentum=0.0,
    dense_names=(),
    steps=STEPS,
    lr=LR,
    passes=1,
    make_model=common.torch_model,
    dtype=torch.float32,
    forward=None,
    exchange="allgather",
):
    """N ranks in one process: per-rank gradients on the same rows as the workers
    (rank_gradients), per-rank error feedback, the method's selection (plain torch), summed
    over ranks and averaged like hvd.Average (or not, for hvd.Sum), plain SGD. Frozen
    parameters are left alone, as Horovod leaves them."""
    model = make_model().to(dtype)
    residuals = [{n: torch.zeros(p.numel()) for n, p in model.named_parameters()} for _ in range(size)]
    buffers = {n: torch.zeros(p.numel()) for n, p in model.named_parameters()}  # SGD momentum
    history = []
    for step in range(steps):
        grads = [rank_gradients(model, step, rank, size, passes, dtype, forward) for rank in range(size)]
        with torch.no_grad():
            for name, p in trained(model):
                if method is None or name in dense_names:  # dense allreduce
                    total = sum(g[name].reshape(-1) for g in grads)
                else:
                    sent = []
                    for rank in range(size):
                        rank_sent, new_residual = METHODS[method](
                            grads[rank][name].reshape(-1),
                            residuals[rank][name] if error_feedback else None,
                            ratio,
                            name,
                            step,
                            simulation.seed_for(method, seed, rank),
                        )
                        if error_feedback:
                            residuals[rank][name] = new_residual
                        sent.append(rank_sent)
                    feedback = [r[name] if error_feedback else None for r in residuals]
                    total = summed(sent, feedback, ratio, exchange)
                update = total / size if op == "average" else total
                if momentum:  # torch.optim.SGD: buf = m * buf + update (the first step: buf = update)
                    buffers[name] = update.clone() if step == 0 else momentum * buffers[name] + update
                    update = buffers[name]
                # SGD adds -lr * grad, the grad in the parameter's dtype (what decompress returns)
                p.add_(update.view(p.shape).to(p.dtype), alpha=-lr)
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return history


def summed(sent, residuals, density, exchange):
    """The sum over the ranks of what each sent (dense tensors): added in rank order, or by
    simulation.spardl, which adds what it drops to the ranks' residuals (in place)."""
    if exchange != "spardl":
        return sum(sent[1:], sent[0])
    selections = [(d[d != 0], d.nonzero().reshape(-1)) for d in sent]
    k = reference.count(density, sent[0].numel())
    return simulation.spardl(selections, residuals, k, sent[0].numel())[0]


def assert_history_close(got, want, **tol):
    for step, (g, w) in enumerate(zip(got, want)):
        for name in w:
            torch.testing.assert_close(g[name], w[name], msg=lambda m: f"step {step}, {name}: {m}", **tol)


def assert_ranks_close(histories, want, **tol):
    """Every rank's history against `want` (within tol), and the ranks against each other exactly."""
    for history in histories:
        assert_history_close(history, want, **tol)
    for history in histories[1:]:
        assert_history_close(history, histories[0], rtol=0, atol=0)


# The workers' configurations (tests/workers/torch_train.py, ddp_train.py) -> the simulation's
# arguments ("dgc": simulate_dgc's).
SIMULATIONS = {
    "dense": {},
    "random_block_0.1": dict(method="random_block", ratio=0.1),
    "random_block_0.1_momentum": dict(method="random_block", ratio=0.1, momentum=0.9),
    "random_block_1.0": dict(method="random_block", ratio=1.0),
    "topk_0.1": dict(method="topk", ratio=0.1),
    "topk_1.0": dict(method="topk", ratio=1.0),
    "topk_0.1_sum": dict(method="topk", ratio=0.1, op="sum"),
    "topk_0.1_predivide": dict(method="topk", ratio=0.1),  # predivide changes rounding only
    "topk_0.1_no_feedback": dict(method="topk", ratio=0.1, error_feedback=False),
    "randomk_0.1": dict(method="randomk", ratio=0.1),
    "randomk_1.0": dict(method="randomk", ratio=1.0),
    "rtopk_0.1": dict(method="rtopk_0.3", ratio=0.1),
    "rtopk_1.0": dict(method="rtopk_1.0", ratio=1.0),
    "threshold_0.1": dict(method="threshold", ratio=0.1),
    "threshold_0.1_fp16": dict(method="threshold_fp16", ratio=0.1),
    "threshold_1.0": dict(method="threshold", ratio=1.0),
    "threshold_0.1_1bit": dict(method="threshold_1bit", ratio=0.1),
    "threshold_0.1_2bit": dict(method="threshold_2bit", ratio=0.1),
    "dense_momentum": dict(momentum=0.9),
    "topk_0.1_default_policy": dict(method="topk", ratio=0.1, dense_names=("0.bias", "2.weight", "2.bias")),
    "dgc_0.1": dict(dgc=dict(ratio=0.1)),
    "dgc_0.05_warmup_clip": dict(dgc=dict(ratio=0.05, warmup_steps=4, stages=2, clip_norm=0.2)),
    "dgc_1.0_no_masking": dict(dgc=dict(ratio=1.0, masking=False, dense_fallback=False)),
    "dgc_0.1_default_policy": dict(dgc=dict(ratio=0.1, dense_names=("0.bias", "2.weight", "2.bias"))),
    "dgc_0.1_default_policy_clip": dict(
        dgc=dict(ratio=0.1, clip_norm=0.2, dense_names=("0.bias", "2.weight", "2.bias"))
    ),
    "dgc_0.5_warmup_dense_stage": dict(dgc=dict(ratio=0.5, warmup_steps=2, stages=1)),
    "dgc_0.1_nesterov": dict(dgc=dict(ratio=0.1, nesterov=True, dense_names=("0.bias", "2.weight", "2.bias"))),
}


def simulated(size, config=None, **settings):
    """The simulation on `size` ranks of a worker's configuration (SIMULATIONS), or of `settings`
    given as SIMULATIONS writes them."""
    settings = dict(SIMULATIONS[config] if config else settings)
    return simulate_dgc(size, **settings.pop("dgc")) if "dgc" in settings else simulate(size, **settings)
