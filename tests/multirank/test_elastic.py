"""Elastic Horovod with every compressor: a worker joins (2 -> 3 ranks), then leaves (the
host discovery script drops it) or fails (it dies mid-step). Real elastic horovodrun with a
host discovery script; every run has a time-out. The workers check at every step that all
ranks hold the same parameters and compressor steps, and that each compressor counted exactly
the committed steps; here: the resets happened, a joiner started with zero residuals while
the survivors kept theirs, and training went on to the end on every remaining rank."""

import json
import re

import pytest
from launch import horovodrun_elastic

METHODS = ("DGC", "Threshold", "TopK", "RTopK", "RandomK", "RandomBlock")


@pytest.mark.parametrize("shrink,recipe", [("leave", "horovod"), ("fail", "horovod"), ("fail", "sparsecomm")])
def test_torch_compressors_follow_a_worker_joining_and_leaving(shrink, recipe, tmp_path):
    # recipe "horovod": TorchState(model, optimizer) as Horovod's docs write it, without compression=;
    # the ranks must still agree after every step (the optimizer's handler, and the agreement check).
    check(
        horovodrun_elastic("torch_elastic.py", tmp_path, "--recipe", recipe, *(["--fail"] if shrink == "fail" else [])),
        shrink,
    )


def check(output, shrink):
    """What every rank printed: the worlds it saw, the residuals it brought to each, its final state."""
    worlds = re.findall(r"world: rank (\d) of (\d) at step (\d+) joined (\w+) residual (\S+)", output)
    grown = [w for w in worlds if w[1] == "3"]
    assert sorted(w[0] for w in grown) == ["0", "1", "2"], output[-4000:]
    for rank, _, _, joined, residual in grown:
        assert (joined == "True") == (rank == "2") and (float(residual) == 0) == (rank == "2"), grown
    assert sorted(w[0] for w in worlds if w[1] == "2" and w[2] != "0") == ["0", "1"], output[-4000:]  # shrunk
    if shrink == "fail":
        assert "rank 2 dies at step" in output
    finals = re.findall(r"final (\w+): rank (\d) of 2 step (\d+) params (\w+)", output)
    for method in METHODS:
        ours = [f for f in finals if f[0] == method]
        assert sorted(f[1] for f in ours) == ["0", "1"] and len({f[2:] for f in ours}) == 1, (method, finals)


@pytest.mark.parametrize("shrink,recipe", [("fail", "sparsecomm"), ("leave", "horovod")])
def test_tf_compressors_follow_a_worker_joining_and_leaving(shrink, recipe, tmp_path):
    # About 60-100 s each here (TF traces the six steps again at each reset). "sparsecomm": the
    # compressors tracked, and a failure (rollback, sparsecomm.tensorflow.elastic.run); "horovod":
    # Horovod's recipe without track, and a shrink by discovery.
    check(
        horovodrun_elastic("tf_elastic.py", tmp_path, "--recipe", recipe, *(["--fail"] if shrink == "fail" else [])),
        shrink,
    )


def test_a_tf_step_traced_for_other_ranks_refuses_to_run(monkeypatch, tf_horovod):
    import tensorflow as tf

    from sparsecomm.tensorflow import TopK

    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    w = tf.Variable(tf.ones([64, 64]))
    compression = TopK(ratio=0.1, exchange="allgather", variables=[("w", w)])
    compression._forget_world()
    monkeypatch.setattr(type(compression), "_ranks", lambda self: 2)  # traced as if the job had 2 ranks

    @tf.function
    def step():
        return compression.compress(tf.ones([64, 64]))[0]

    compression._allgather_ints = lambda ints, name: list(ints) * 2
    with pytest.raises(tf.errors.InvalidArgumentError, match="this step was traced for 2 ranks"):
        step()


def test_a_reset_by_elastic_run_makes_the_next_tf_trace_adopt_rank_0s_steps(monkeypatch, tf_horovod):
    # A worker replaced at the same number of ranks, without track: only elastic.run's reset says so.
    import tensorflow as tf

    from sparsecomm.core import agreement
    from sparsecomm.tensorflow import RandomBlock, elastic

    w = tf.Variable(tf.ones([64, 64]))
    compression = RandomBlock(ratio=0.1, variables=[("w", w)], min_numel=0)
    monkeypatch.setattr(type(compression), "_ranks", lambda self: 2)
    rank0 = {
        "settings": json.dumps([compression.settings(), agreement.digest({"w": {"step": 5}}), False]),
        "state": json.dumps({"w": {"step": 5}}),
    }
    parts = []

    def allgather(ints, name):  # this rank is rank 1; rank 0 is at step 5 (and did not flag a reset)
        part, what = name.rsplit(".", 2)[1:]
        parts.append(part)
        theirs = list(rank0[part].encode())
        return ([len(theirs)] if what == "length" else theirs) + list(ints)

    compression._allgather_ints = allgather

    def trace():
        return tf.function(lambda: compression.compress(tf.ones([64, 64]))[0])()

    with pytest.raises(ValueError, match="tensor 'w', step: rank 0: 5, rank 1: 0"):
        trace()  # the first step: rank 0 alone at step 5 is refused
    assert parts == ["settings"] * 2 + ["state"] * 2
    monkeypatch.setattr(elastic, "_resets", elastic.resets() + 1)
    trace()
    assert parts[4:] == ["settings"] * 2 + ["state"] * 2 and int(compression.state[0].step.numpy()) == 6
    trace()  # no reset since: no check
    assert len(parts) == 8
