"""A burst of NaN and +-Inf in one rank's gradient at one step (common.BURST: rank 1, step
common.BURST_STEP), through Horovod's allreduce with every torch compressor on 2 ranks
(tests/workers/torch_nonfinite.py), against the NaN/Inf policy of docs/kernels.md and
docs/compressors.md: what reaches each rank's reduced gradient, at which step, and what stays
in the residual and the momentum."""

import math

import common
import pytest
import reference
import torch
from launch import horovodrun, saved_ranks

SIZE, S, BURST = 2, common.BURST_STEP, common.BURST
BURST_NUMEL = math.prod(common.BURST_SHAPE)
CONFIGS = (
    "topk",
    "topk_spardl",
    "threshold",
    "threshold_2bit",
    "dgc",
    "dgc_no_masking",
    "rtopk",
    "randomk",
    "random_block",
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return saved_ranks(tmp_path_factory, horovodrun, SIZE, "torch_nonfinite.py")


def _nonfinite(tensor):
    return set((~tensor.isfinite()).nonzero().reshape(-1).tolist())


def _assert_burst_values(reduced, coordinates):
    """At each coordinate the burst's own kind: NaN, +inf or -inf (the other rank's value is finite)."""
    for c in coordinates:
        value, want = reduced[c].item(), BURST[c]
        assert (math.isnan(value) and math.isnan(want)) or value == want, (c, value, want)


@pytest.mark.parametrize("config", CONFIGS)
def test_ranks_get_the_same_bits_and_nothing_is_non_finite_before_the_burst(ranks, config):
    for step in range(common.BURST_STEPS):
        zero, one = (ranks[r][config][step]["reduced"] for r in range(SIZE))
        assert torch.equal(zero.view(torch.int32), one.view(torch.int32)), step  # NaNs included, bit for bit
    for rank in range(SIZE):
        for step in range(S):
            assert not any(_nonfinite(t) for t in ranks[rank][config][step].values()), (rank, step)
        assert not _nonfinite(ranks[0][config][-1].get("residual", torch.zeros(1)))  # rank 0 never had any


@pytest.mark.parametrize("config", ["topk", "topk_spardl", "threshold", "dgc"])
def test_threshold_methods_send_a_burst_smaller_than_k_at_once_and_keep_none_of_it(ranks, config):
    """A non-finite acc counts as above every threshold (NaN as +inf for top-k): every rank's
    reduced gradient is non-finite at exactly the burst's coordinates, at that step only, and no
    residual or momentum keeps a non-finite value."""
    for rank in range(SIZE):
        for step, got in enumerate(ranks[rank][config]):
            assert _nonfinite(got["reduced"]) == (set(BURST) if step == S else set()), (rank, step)
            for key in ("residual", "momentum"):
                assert not _nonfinite(got.get(key, torch.zeros(1))), (rank, step, key)
        _assert_burst_values(ranks[rank][config][S]["reduced"], BURST)


def test_dgc_without_momentum_masking_keeps_a_burst_in_its_momentum_and_sends_it_every_step(ranks):
    """As a momentum buffer of dense momentum SGD would: u = m u + g stays non-finite."""
    for step in range(S, common.BURST_STEPS):
        got = ranks[1]["dgc_no_masking"][step]
        assert _nonfinite(got["reduced"]) == set(BURST) and _nonfinite(got["momentum"]) == set(BURST), step
        assert not _nonfinite(got["residual"]), step
        _assert_burst_values(got["reduced"], BURST)
        assert not _nonfinite(ranks[0]["dgc_no_masking"][step]["momentum"]), step


def test_quantized_values_spread_a_burst_over_its_class_for_a_step(ranks):
    """A non-finite value makes its class's scale non-finite, so every value of that class that
    rank 1 sends decodes to it: more coordinates than the burst, for that step only. The finite
    values sent as +-inf leave 0 in the residual, not acc - inf (feedback.h's finite_or_zero),
    so the next step is finite everywhere."""
    history = [ranks[r]["threshold_2bit"] for r in range(SIZE)]
    spread = _nonfinite(history[0][S]["reduced"])
    assert spread > set(BURST) and len(spread) > 10 * len(BURST)
    for step in range(S, common.BURST_STEPS):
        assert not any(_nonfinite(history[r][step]["residual"]) for r in range(SIZE)), step
        assert step == S or not _nonfinite(history[0][step]["reduced"]), step


def _first_draw(config, coordinate):
    """The first step from S on at which `coordinate` is among the shared coordinates (reference)."""
    numel, ratio, tid = BURST_NUMEL, common.BURST_RANDOM_RATIO, reference.tensor_id("w")
    k = reference.count(ratio, numel)
    for step in range(S, common.BURST_STEPS):
        if config == "randomk":
            drawn = reference.random_k_indices(3, tid, step, numel, k)
        else:
            drawn = reference.block_indices(reference.block_start(3, tid, step, numel), k, numel).tolist()
        if coordinate in drawn:
            return step
    return None


@pytest.mark.parametrize("config", ["randomk", "random_block", "rtopk"])
def test_random_coordinate_methods_keep_an_unsent_burst_in_the_residual_until_it_is_drawn(ranks, config):
    """A burst coordinate that is not drawn stays non-finite in rank 1's residual (acc + g stays
    NaN or inf) and reaches every rank's reduced gradient, with its kind, at the step it is
    drawn, once; then its residual is 0. RandomK and RandomBlock draw their coordinates from
    (seed, step, name): the steps are predicted by the reference. rTop-k draws k of the top r,
    where a non-finite acc always is."""
    surfaced = {}
    for step in range(S, common.BURST_STEPS):
        reduced = ranks[0][config][step]["reduced"]
        arrived = _nonfinite(reduced)
        assert arrived <= set(BURST) - set(surfaced), step
        _assert_burst_values(reduced, arrived)
        surfaced.update((c, step) for c in arrived)
        assert _nonfinite(ranks[1][config][step]["residual"]) == set(BURST) - set(surfaced), step
        assert not _nonfinite(ranks[0][config][step]["residual"]), step
    if config != "rtopk":
        assert surfaced == {c: _first_draw(config, c) for c in BURST}
        assert set(surfaced) == set(BURST)  # none waits forever (in this run)
    # rTop-k draws k of the top r on each rank: a burst coordinate may still wait after the last
    # step (the loop checked it is in rank 1's residual then); most surfaced, some after waiting
    assert len(surfaced) >= len(BURST) - 1 and max(surfaced.values()) > S, surfaced
