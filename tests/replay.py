"""A plain-torch replay of N ranks' SGD steps from their recorded local gradients (the workers
torch_spardl.py and torch_hierarchical.py save them): each rank's selection by simulation.py,
then the exchange (allgather, SparDL, hierarchical or dense), then SGD. What the multi-rank
tests of the per-rank-coordinate exchanges compare every rank with."""

import common
import reference
import simulation
import torch

STEPS, LR = 4, 0.5
METHOD = {"topk": "topk", "threshold": "threshold", "rtopk": "rtopk_0.3", "threshold_fp16": "threshold_fp16"}


def replay(
    ranks, config, method, ratio, exchange, error_feedback=True, dgc=False, value_dtype=torch.float32, per_host=None
):
    """From the recorded local gradients: parameters after each step, final residuals, each
    step's exchanged (averaged, float32) gradients and each rank's received bytes (SparDL's,
    its values on the wire as value_dtype). exchange="hierarchical" needs `per_host`, the ranks
    of each host."""
    size = len(ranks)
    params = {n: p.detach().clone().reshape(-1) for n, p in common.torch_model().named_parameters()}
    residuals = [{n: torch.zeros(p.numel()) for n, p in params.items()} for _ in range(size)]
    momenta = [{n: torch.zeros(p.numel()) for n, p in params.items()} for _ in range(size)]
    scale = torch.tensor(1.0) / size
    history, exchanged, received = [], [], [{n: 0 for n in params} for _ in range(size)]
    for step in range(STEPS):
        exchanged.append({})
        for name in params:
            numel, k = params[name].numel(), reference.count(ratio, params[name].numel())
            grads = [ranks[rank][config]["grads"][step][name].reshape(-1) for rank in range(size)]
            if dgc:
                sent = [_dgc_sent(grads[r], residuals[r], momenta[r], name, ratio, step) for r in range(size)]
            else:
                sent = [
                    _sent(grads[r], residuals[r], name, method, ratio, step, r, error_feedback) for r in range(size)
                ]
            kept = [r[name] if error_feedback else None for r in residuals]  # where exchanges drop values
            selections = [(d[d != 0], d.nonzero().reshape(-1)) for d in sent]
            if exchange == "spardl":
                total, got = simulation.spardl(selections, kept, k, numel, value_dtype)
                for rank in range(size):
                    received[rank][name] += got[rank]
            elif exchange == "hierarchical":
                total = simulation.hierarchical(selections, kept, k, numel, per_host, value_dtype)
            elif exchange == "allgather":
                total = sum(sent)
            else:  # dense
                total = sum(grads)
            exchanged[step][name] = total * scale
            params[name] = params[name] - LR * exchanged[step][name]
        history.append({n: p.clone() for n, p in params.items()})
    return history, residuals, exchanged, received


def _dgc_sent(grad, residuals, momenta, name, ratio, step):
    """One rank's DGC send (dense, float32); its residual and momentum updated."""
    dense, (residuals[name], momenta[name]) = simulation.dgc(grad, (residuals[name], momenta[name]), ratio, name, step)
    return dense


def _sent(grad, residuals, name, method, ratio, step, rank, error_feedback):
    """One rank's send by `method` (dense, float32); its residual updated with error feedback."""
    dense, new = simulation.METHODS[METHOD[method]](
        grad,
        residuals[name] if error_feedback else None,
        ratio,
        name,
        step,
        simulation.seed_for(METHOD[method], 7, rank),
    )
    if error_feedback:
        residuals[name] = new
    return dense
