"""sparsecomm.tensorflow compressors under horovodrun -np 2 and -np 3 with stock
hvd.DistributedGradientTape in tf.function (plus eager and hvd.allreduce), against a
single-process plain-torch replay of the N ranks.

The workers record each rank's local gradient at each step; the replay feeds those to the
reference of each method (tests/simulation.py: error feedback, selection, quantization,
DGC), sums over ranks, scales like Horovod and applies SGD in float32. Selections are
therefore compared exactly; parameters to float32 rounding of the averaging.

The "plain_" configs bind every method to a plain list of unnamed variables (all named
"Variable" by TF): they train, the ranks agree, and the replay with the unique display names
as stream keys matches (no two variables share a random stream)."""

import pytest
import reference
import simulation
import torch
from launch import saved_sizes
from simulation import METHODS, dgc_density

pytest.importorskip("tensorflow")
STEPS, LR = 5, 0.5
NAMES = ("0.weight", "0.bias", "2.weight", "2.bias")
# The "plain_" configs bind the unnamed variables (TF names each "Variable"): the compressor's
# display names, which key their random streams (tensor_id), in binding order.
PLAIN = ("Variable", "Variable_1", "Variable_2", "Variable_3")
# config -> the replay's settings (method of tests/simulation.py, ratio, seed, op, ...)
REPLAYS = {
    "dense": {},
    "random_block_0.1": dict(method="random_block", ratio=0.1),
    "random_block_1.0": dict(method="random_block", ratio=1.0),
    "randomk_0.1": dict(method="randomk", ratio=0.1),
    "randomk_1.0": dict(method="randomk", ratio=1.0),
    "topk_0.1": dict(method="topk", ratio=0.1),
    "topk_1.0": dict(method="topk", ratio=1.0),
    "topk_0.1_sum": dict(method="topk", ratio=0.1, op="sum"),
    "topk_0.1_predivide": dict(method="topk", ratio=0.1),
    "topk_0.1_no_feedback": dict(method="topk", ratio=0.1, error_feedback=False),
    "topk_0.1_default_policy": dict(method="topk", ratio=0.1, dense_names=("0.bias", "2.weight", "2.bias")),
    "topk_0.1_groups": dict(method="topk", ratio=0.1),
    "topk_0.1_eager": dict(method="topk", ratio=0.1),
    "topk_0.1_allreduce": dict(method="topk", ratio=0.1),
    "rtopk_0.1": dict(method="rtopk_0.3", ratio=0.1),
    "rtopk_1.0": dict(method="rtopk_1.0", ratio=1.0),
    "threshold_0.1": dict(method="threshold", ratio=0.1),
    "threshold_1.0": dict(method="threshold", ratio=1.0),
    "threshold_0.1_fp16": dict(method="threshold_fp16", ratio=0.1),
    "threshold_0.1_1bit": dict(method="threshold_1bit", ratio=0.1),
    "threshold_0.1_2bit": dict(method="threshold_2bit", ratio=0.1),
    "dgc_0.1": dict(dgc=dict(ratio=0.1)),
    "dgc_0.05_warmup_clip": dict(dgc=dict(ratio=0.05, warmup_steps=4, stages=2, clip_norm=0.2)),
    "dgc_0.5_warmup_dense_stage": dict(dgc=dict(ratio=0.5, warmup_steps=2, stages=1)),
    "dgc_1.0_no_masking": dict(dgc=dict(ratio=1.0, masking=False, dense_fallback=False)),
    "dgc_0.1_default_policy": dict(dgc=dict(ratio=0.1, dense_names=("0.bias", "2.weight", "2.bias"))),
    "dgc_0.1_default_policy_clip": dict(
        dgc=dict(ratio=0.1, clip_norm=0.2, dense_names=("0.bias", "2.weight", "2.bias"))
    ),
    "dgc_0.1_nesterov": dict(dgc=dict(ratio=0.1, nesterov=True, dense_names=("0.bias", "2.weight", "2.bias"))),
    "plain_random_block_0.1": dict(method="random_block", ratio=0.1, streams=PLAIN),
    "plain_randomk_0.1": dict(method="randomk", ratio=0.1, streams=PLAIN),
    "plain_topk_0.1": dict(method="topk", ratio=0.1, streams=PLAIN),
    "plain_rtopk_0.1": dict(method="rtopk_0.3", ratio=0.1, streams=PLAIN),
    "plain_threshold_0.1": dict(method="threshold", ratio=0.1, streams=PLAIN),
    "plain_dgc_0.1": dict(dgc=dict(ratio=0.1), streams=PLAIN),
}


def replay(
    ranks,
    config,
    method=None,
    ratio=None,
    seed=7,
    op="average",
    error_feedback=True,
    dense_names=(),
    dgc=None,
    streams=NAMES,
):
    """Parameters after each step on N ranks, from the recorded local gradients. `streams`: the
    name that keys each variable's random stream, in the order of NAMES."""
    size = len(ranks)
    stream = dict(zip(NAMES, streams))
    params = {n: torch.from_numpy(ranks[0][f"initial/{n}"]).reshape(-1) for n in NAMES}
    residuals = [{n: torch.zeros(p.numel()) for n, p in params.items()} for _ in range(size)]
    dgc_state = [{n: (torch.zeros(p.numel()), torch.zeros(p.numel())) for n, p in params.items()} for _ in range(size)]
    scale = torch.tensor(1.0, dtype=torch.float32) / size  # output / M, in float32 (exchange.finish)
    history = []
    for step in range(STEPS):
        for name in NAMES:
            grads = [torch.from_numpy(r[f"{config}/grad/{step}/{name}"]).reshape(-1) for r in ranks]
            if dgc is not None:
                settings = dict(dgc)
                density = dgc_density(
                    settings["ratio"], step, settings.get("warmup_steps", 0), settings.get("stages", 4)
                )
                clip = settings.get("clip_norm")
                total = 0
                for rank in range(size):
                    # where the sparse payload (k values + k indices) would not be smaller, momentum SGD
                    numel = grads[rank].numel()
                    larger = settings.get("dense_fallback", True) and reference.sparse_is_larger(density, numel)
                    dense = name in settings.get("dense_names", ()) or larger
                    sent, dgc_state[rank][name] = simulation.dgc(
                        grads[rank],
                        dgc_state[rank][name],
                        density,
                        stream[name],
                        step,
                        masking=settings.get("masking", True),
                        clip_limit=None if clip is None else clip / size**0.5,
                        dense=dense,
                        nesterov=settings.get("nesterov", False),
                    )
                    total = total + sent
            elif method is None or name in dense_names:
                total = sum(grads)
            else:
                total = 0
                for rank in range(size):
                    sent, new_residual = METHODS[method](
                        grads[rank],
                        residuals[rank][name] if error_feedback else None,
                        ratio,
                        stream[name],
                        step,
                        simulation.seed_for(method, seed, rank),
                    )
                    if error_feedback:
                        residuals[rank][name] = new_residual
                    total = total + sent
            update = total * scale if op == "average" else total
            params[name] = params[name] - torch.tensor(LR, dtype=torch.float32) * update
        history.append({n: p.clone() for n, p in params.items()})
    return history


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def run(request, tmp_path_factory):
    """A launch a size, the job's own: one launch with the 2 ranks as a process set of 3 costs as
    much, the sets' idle coordination paid through the long tracing (docs/testing.md)."""
    size = request.param
    return saved_sizes(tmp_path_factory, size, "tf_train.py", (size,), "--steps", STEPS, "--lr", LR, timeout=600)[size]


def params_of(rank, config, step):
    return {n: torch.from_numpy(rank[f"{config}/param/{step}/{n}"]).reshape(-1) for n in NAMES}


@pytest.mark.parametrize("config", list(REPLAYS))
def test_every_rank_equals_the_replay(run, config):
    want = replay(run, config, **REPLAYS[config])
    for rank, recorded in enumerate(run):
        for step in range(STEPS):
            got = params_of(recorded, config, step)
            for name in NAMES:
                torch.testing.assert_close(
                    got[name],
                    want[step][name],
                    rtol=1e-5,
                    atol=1e-6,
                    msg=lambda m: f"rank {rank}, step {step}, {name}: {m}",
                )
                if rank:  # the ranks agree exactly
                    assert torch.equal(got[name], params_of(run[0], config, step)[name]), (config, rank, step, name)


def test_training_moved_every_parameter_and_differs_from_dense(run):
    """Guards against a vacuous pass (e.g. compress never running)."""
    last = STEPS - 1
    dense = params_of(run[0], "dense", last)
    methods = ("random_block_0.1", "randomk_0.1", "topk_0.1", "rtopk_0.1", "threshold_0.1", "dgc_0.1")
    for config in methods + tuple(f"plain_{m}" for m in methods):
        got = params_of(run[0], config, last)
        for name in NAMES:
            assert not torch.equal(got[name], torch.from_numpy(run[0][f"initial/{name}"]).reshape(-1)), (config, name)
            assert not torch.equal(got[name], dense[name]), (config, name)


@pytest.mark.parametrize("config", ["random_block_1.0", "randomk_1.0", "topk_1.0", "rtopk_1.0", "threshold_1.0"])
def test_ratio_one_equals_dense(run, config):
    tol = dict(rtol=0, atol=0) if len(run) == 2 else dict(rtol=1e-6, atol=1e-7)  # 3 ranks: 1/3 rounds
    for step in range(STEPS):
        got, dense = params_of(run[0], config, step), params_of(run[0], "dense", step)
        for name in NAMES:
            torch.testing.assert_close(got[name], dense[name], **tol)


def test_the_retraced_configs_traced_their_step_twice_and_the_others_once(run):
    """The state carrying across two traces is checked by the replay of the configs that retrace:
    one per compressor class, and its quantized and warm-up forms (tests/workers/tf_train.py)."""
    retraced = {"random_block_0.1", "randomk_0.1", "topk_0.1", "rtopk_0.1", "threshold_0.1"}
    retraced |= {"threshold_0.1_2bit", "dgc_0.1", "dgc_0.05_warmup_clip"}
    traced = {config for config in REPLAYS if f"{config}/traces" in run[0]}
    assert traced == set(REPLAYS) - {"topk_0.1_eager", "topk_0.1_allreduce"}
    for config in traced:
        assert int(run[0][f"{config}/traces"]) == (2 if config in retraced else 1), config


def test_plain_unnamed_variables_get_unique_names_in_stats(run):
    for rank in run:
        for config in (c for c in REPLAYS if c.startswith("plain_")):
            assert rank[f"{config}/stats/names"].tolist() == list(PLAIN), config
        assert rank["topk_0.1/stats/names"].tolist() == list(NAMES)  # names given in pairs are kept


def test_sparse_configs_send_less_than_dense(run):
    for config in ("topk_0.1", "threshold_0.1", "random_block_0.1", "threshold_0.1_1bit"):
        sent, dense = float(run[0][f"{config}/stats/sent_bytes"]), float(run[0][f"{config}/stats/dense_bytes"])
        assert 0 < sent < 0.5 * dense, (config, sent, dense)


def test_shared_coordinates_count_what_the_ring_allreduce_receives(run):
    """random_block_0.1 rides Horovod's ring allreduce: each rank receives 2 (N-1)/N of what it
    sent, per tensor and step (each count rounded down; stats() counted none before)."""
    size = len(run)
    for rank in run:
        sent, received = (
            float(rank["random_block_0.1/stats/sent_bytes"]),
            float(rank["random_block_0.1/stats/received_bytes"]),
        )
        calls = int(rank["random_block_0.1/stats/calls"])
        assert sent > 0 and 0 <= sent * 2 * (size - 1) / size - received < calls, (sent, received)
