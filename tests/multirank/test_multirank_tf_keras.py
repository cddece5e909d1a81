"""TensorFlow beyond the tape: model.fit under tf-keras (Horovod's Keras layer) and Keras 3
(sparsecomm.tensorflow.keras) with DGC on real data, tf.train.Checkpoint round trips, and
the torch and TF compressors giving the same bits through real Horovod."""

import json
import re

import numpy as np
import pytest
from launch import horovodrun

pytest.importorskip("tensorflow")


@pytest.mark.parametrize("flavour", ["legacy", "3"], ids=["tf-keras", "keras3"])
def test_model_fit_with_dgc_keeps_ranks_in_sync_and_matches_dense(tmp_path, flavour):
    horovodrun(2, "tf_keras_fit.py", "--out", tmp_path, "--keras", flavour, timeout=600)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for method in ("dense", "dgc"):
        weights = [np.load(tmp_path / f"{method}_rank{r}.npz") for r in range(2)]
        for key in weights[0].files:  # ranks started from different weights: the broadcast and the exchange sync them
            np.testing.assert_array_equal(weights[0][key], weights[1][key], err_msg=f"{method} {key}")
    dense, dgc = results[0]["dense"]["accuracy"], results[0]["dgc"]["accuracy"]
    print(
        f"{flavour}: test accuracy dense {dense:.4f}, DGC 1% {dgc:.4f}, "
        f"DGC sent {results[0]['dgc']['sent_bytes'] / results[0]['dgc']['dense_bytes']:.3f} of dense bytes"
    )
    assert dense > 0.93
    assert dgc >= dense - 0.02, (dense, dgc)
    assert results[0]["dgc"]["sent_bytes"] < 0.2 * results[0]["dgc"]["dense_bytes"]


def test_checkpoint_restore_continue_equals_not_stopping(tmp_path):
    horovodrun(2, "tf_checkpoint.py", "--out", tmp_path)
    for rank in range(2):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for config in ("dgc", "random_block", "threshold_2bit"):
            for i in range(4):
                np.testing.assert_array_equal(
                    got[f"{config}/resumed/{i}"],
                    got[f"{config}/straight/{i}"],
                    err_msg=f"rank {rank} {config} variable {i}",
                )
            assert got[f"{config}/steps"].tolist() == [5, 5, 5, 5]  # restored steps, then 2 more


SIZES = (2, 3, 4)


@pytest.fixture(scope="module")
def cross_framework(tmp_path_factory):
    """The folder where each framework's ranks saved each size: one launch of 4 ranks per
    framework, the sizes one after another on the first 2, 3 and 4 ranks (the smaller two as
    process sets: tests/workers/cross_framework.py --sizes)."""
    out = tmp_path_factory.mktemp("cross_framework")
    for framework in ("torch", "tf"):
        sizes = map(str, SIZES)
        horovodrun(max(SIZES), "cross_framework.py", "--out", out, "--framework", framework, "--sizes", *sizes)
    return out


@pytest.mark.parametrize("size", SIZES, ids=lambda n: f"np{n}")
def test_torch_and_tf_compressors_give_the_same_bits(cross_framework, size):
    """Same settings and per-rank gradients (f32, f16, bf16; one with a NaN and +-inf on rank 1
    at step 1) through each framework's hvd.allreduce(..., compression=): every step's result
    and the final residual and momentum are bitwise equal (NaN payloads included), for every
    method (including quantized, warm-up and policy-dense DGC) and exchange (allgather and
    SparDL; the torch SparDL equals the plain replay on 2-4 ranks, tests/multirank/test_multirank_spardl.py).
    2 and 3 ranks run as a process set of a 4-rank job, 4 ranks as the job itself."""
    for rank in range(size):
        torch_out, tf_out = (dict(np.load(cross_framework / f"{f}_np{size}_rank{rank}.npz")) for f in ("torch", "tf"))
        # TF creates a residual for every compressed variable up front; torch on first use
        extra = set(tf_out) - set(torch_out)
        assert set(torch_out) <= set(tf_out) and all("/residual/" in k and not tf_out[k].any() for k in extra), extra
        assert len(torch_out) > 100
        for key, value in torch_out.items():
            if "/exchange/" in key:  # the choice of exchange="auto"
                assert str(value) == str(tf_out[key]), (rank, key, value, tf_out[key])
                continue
            np.testing.assert_array_equal(
                value.view(np.int32), tf_out[key].view(np.int32), err_msg=f"rank {rank} {key}"
            )
        burst = torch_out["topk/1/a.weight"].reshape(-1)[[5, 700, 1500]]  # sent at once (top-k: NaN as +inf)
        assert np.isnan(burst[0]) and burst[1] == np.inf and burst[2] == -np.inf
        assert str(torch_out["topk_auto_fast/exchange/a.weight"]) == "dense"
        assert str(torch_out["topk_auto_slow/exchange/a.weight"]) == ("allgather" if size == 2 else "spardl")


def test_settings_or_checkpoints_that_differ_across_ranks_raise_the_same_error_everywhere():
    output = horovodrun(2, "tf_settings.py", timeout=180)
    assert output.count(": trained") == 2, output[-3000:]  # equal settings: both ranks train
    errors = [
        line.split("ValueError: ", 1)[1]
        for line in output.splitlines()
        if "ValueError: TopK: compressor settings differ across ranks" in line
    ]
    assert len(errors) == 2 and errors[0] == errors[1], output[-3000:]
    assert "rank 0: TopK(" in errors[0] and "ratio=0.1" in errors[0] and "ratio=0.2" in errors[0]
    # Checkpoints of different steps, restored before the step is traced: RandomBlock would pick different blocks.
    for case, steps in (("different steps", "rank 0: 1, rank 1: 3"), ("one rank", "rank 0: 0, rank 1: 3")):
        for rank in range(2):  # (TF puts the trace's "in user code" lines between the two)
            assert f"[{rank}]<stdout>:rank {rank}: {case}: ValueError" in output, output[-3000:]
            assert re.search(
                rf"\[{rank}\]<stdout>:\s*ValueError: RandomBlock: the ranks' compressor state differs: "
                rf"tensor 'w', step: {steps}\.",
                output,
            ), output[-3000:]
    # The graph checks the reduced placeholder (core.placement): each rank's compressor over the
    # rank alone under a tape over both, and hvd.Min, fail it on every rank.
    for rank in range(2):
        for case, given in (
            ("compressor alone", rf"process_set with ranks \[{rank}\]"),
            ("op Min", "process_set=None, every rank"),
        ):
            assert re.search(
                rf"rank {rank}: {case}: InvalidArgumentError: .*TopK: Horovod reduced the compressor's placeholder "
                rf"over other ranks than the compressor's \({given}\), or with an op other",
                output,
            ), output[-3000:]
