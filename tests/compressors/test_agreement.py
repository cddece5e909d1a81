"""The cross-rank check of settings and shared state (sparsecomm/core/agreement.py, and
Settings._check_world that runs it), on N ranks simulated by N threads: each rank's collective
returns what every rank handed it, in rank order, as Horovod's allgather does."""

import threading

import pytest

from sparsecomm.core import agreement, methods
from sparsecomm.core.compressor import Settings
from sparsecomm.core.cost import Network

SLOW = Network(bandwidth=1e7, latency=1e-6)


class Collective:
    """An allgather among `ranks` threads: everyone's ints, concatenated in rank order."""

    def __init__(self, ranks):
        self.ranks, self.calls = ranks, []
        self._handed = [None] * ranks
        self._barrier = threading.Barrier(ranks, timeout=10)

    def allgather(self, rank, ints, name):
        self._handed[rank] = list(ints)
        self._barrier.wait()
        result = sum(self._handed, [])
        if rank == 0:
            self.calls.append(name)
        self._barrier.wait()
        return result


class Rank(Settings):
    """One rank's compressor, framework-free: its shared state is {tensor: {"step": n}}."""

    def __init__(self, rank, collective, steps, method=None):
        super().__init__(method or methods.RandomBlock("RandomBlock", 0.05, 7, True))
        self.rank, self.collective, self.steps = rank, collective, dict(steps)

    def _ranks(self):
        return self.collective.ranks

    def _allgather_ints(self, ints, name):
        return self.collective.allgather(self.rank, ints, name)

    def _shared_state(self):
        return {name: {"step": step} for name, step in self.steps.items()}

    def _adopt_shared_state(self, shared):
        self.steps = {name: fields["step"] for name, fields in shared.items()}

    def _measure_network(self, device):
        raise AssertionError("nothing routes here")

    def pack(self, tensor, state, density):
        raise AssertionError("nothing packs here")


def on_every_rank(ranks, action):
    """Runs action(rank) on every rank at once: what each returned or raised, in rank order."""
    outcomes = [None] * len(ranks)

    def run(i):
        try:
            outcomes[i] = action(ranks[i])
        except Exception as error:  # noqa: BLE001 - the outcome under test
            outcomes[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    return outcomes


def world(steps_per_rank, method=None):
    collective = Collective(len(steps_per_rank))
    return collective, [Rank(r, collective, steps, method) for r, steps in enumerate(steps_per_rank)]


def check(rank):
    return rank._check_world()


def test_ranks_that_agree_pay_one_check_of_two_collectives():
    collective, ranks = world([{"a": 5, "b": 3}] * 3)
    assert on_every_rank(ranks, check) == [3, 3, 3]
    assert [name.rsplit(".", 2)[1:] for name in collective.calls] == [["settings", "length"], ["settings", "text"]]
    assert on_every_rank(ranks, check) == [3, 3, 3] and len(collective.calls) == 2  # the steady state: nothing


def test_different_settings_raise_the_same_error_listing_every_rank():
    collective = Collective(2)
    ranks = [Rank(0, collective, {}, methods.TopK("TopK", 0.1)), Rank(1, collective, {}, methods.TopK("TopK", 0.2))]
    errors = on_every_rank(ranks, check)
    assert all(isinstance(e, ValueError) for e in errors) and str(errors[0]) == str(errors[1])
    assert str(errors[0]).startswith("TopK: compressor settings differ across ranks (rank 0: TopK(dense=(),")
    assert "ratio=0.1" in str(errors[0]) and "; rank 1: TopK(" in str(errors[0]) and "ratio=0.2" in str(errors[0])


def test_different_steps_at_the_first_step_raise_on_every_rank_naming_tensor_field_and_values():
    # A checkpoint loaded on rank 1 only: nothing tells which rank is right.
    collective, ranks = world(
        [{"fc.bias": 0, "fc.weight": 0}, {"fc.bias": 40, "fc.weight": 40}, {"fc.bias": 0, "fc.weight": 0}]
    )
    errors = on_every_rank(ranks, check)
    assert all(isinstance(e, ValueError) for e in errors) and len({str(e) for e in errors}) == 1, errors
    assert (
        "RandomBlock: the ranks' compressor state differs: tensor 'fc.bias', step: rank 0: 0, rank 1: 40, "
        "rank 2: 0 (and 1 more tensors)."
    ) in str(errors[0])
    assert [name.rsplit(".", 2)[1] for name in collective.calls] == ["settings"] * 2 + ["state"] * 2
    assert [r.steps for r in ranks] == [
        {"fc.bias": 0, "fc.weight": 0},
        {"fc.bias": 40, "fc.weight": 40},
        {"fc.bias": 0, "fc.weight": 0},
    ]  # nothing adopted


def grown(survivors, joiner_steps):
    """The survivors (checked together in a world of their own) and a fresh joiner, in one new world."""
    collective = Collective(len(survivors) + 1)
    joiner = Rank(len(survivors), collective, joiner_steps)
    for rank in survivors:
        rank.collective = collective
    return collective, survivors + [joiner]


@pytest.mark.parametrize("told", [True, False], ids=["synced", "new-count"])
def test_after_an_elastic_reset_every_rank_adopts_rank_0s_steps(told):
    # Told by the elastic state's sync, or seeing only a new number of ranks (Horovod's recipe
    # without the compressor in the state).
    _, survivors = world([{"w": 12, "b": 12}, {"w": 12, "b": 12}])
    on_every_rank(survivors, check)
    survivors[0].steps["b"] = 13  # rank 0 was partly into step 13 when a worker failed
    collective, ranks = grown(survivors, {"w": 0, "b": 0})
    if told:
        for rank in ranks:
            rank._forget_world()
    assert on_every_rank(ranks, check) == [3, 3, 3]
    assert [r.steps for r in ranks] == [{"w": 12, "b": 13}] * 3
    assert [name.rsplit(".", 2)[1] for name in collective.calls] == ["settings"] * 2 + ["state"] * 2


def test_a_reset_seen_by_one_rank_is_enough_and_a_shrink_is_seen_as_a_new_count():
    _, ranks = world([{"w": 4}, {"w": 4}, {"w": 4}], methods.TopK("TopK", 0.1))  # exchange="auto"
    on_every_rank(ranks, check)
    ranks[0].planner.use_measurement(SLOW, None)
    ranks[0].steps["w"], ranks[1].steps["w"] = 5, 4  # rank 2 left in the middle of a step
    collective = Collective(2)
    for rank in ranks[:2]:
        rank.collective = collective
    assert on_every_rank(ranks[:2], check) == [2, 2] and [r.steps for r in ranks[:2]] == [{"w": 5}] * 2
    assert ranks[0].planner.auto.network is None  # measured again for the new world


def test_after_load_state_dict_a_difference_raises_and_no_check_runs_otherwise():
    collective, ranks = world([{"w": 8}, {"w": 8}])
    on_every_rank(ranks, check)
    ranks[1].steps["w"] = 3  # rank 1 loaded another checkpoint
    for rank in ranks:
        rank._check_state_again()
    errors = on_every_rank(ranks, check)
    assert all("tensor 'w', step: rank 0: 8, rank 1: 3." in str(e) for e in errors), errors
    ranks[1].steps["w"] = 8
    calls = len(collective.calls)
    assert on_every_rank(ranks, check) == [2, 2] and len(collective.calls) == calls + 2  # checked again, agreed


def test_the_error_names_a_tensor_absent_on_some_rank_and_the_first_differing_field():
    everyone = [{"w": {"step": 2, "stage": 1}}, {"w": {"step": 2, "stage": 0}, "v": {"step": 1}}]
    text = agreement.disagreement("DGC", everyone)
    assert text.startswith(
        "DGC: the ranks' compressor state differs: tensor 'v', step: rank 0: absent, rank 1: 1 (and 1 more tensors)."
    )
    assert "tensor 'w', stage: rank 0: 1, rank 1: 0." in agreement.disagreement(
        "DGC", [everyone[0], {"w": {"step": 2, "stage": 0}}]
    )
    assert agreement.digest({"a": {"step": 1}, "b": {"step": 2}}) == agreement.digest(
        {"b": {"step": 2}, "a": {"step": 1}}
    )


def test_the_check_is_named_by_the_compressors_built_before_it_over_the_same_ranks():
    """A rank that builds compressors for a process set it is in, and one that is not, name the
    check of a later compressor over every rank alike (its collectives would wait forever on
    different names; tests/workers/cross_framework.py --sizes runs this on 4 ranks)."""
    import horovod.torch as hvd

    from sparsecomm.torch import TopK

    pair = hvd.ProcessSet([0, 1])
    first = TopK(ratio=0.1)
    in_the_pair = [TopK(ratio=0.1, process_set=pair) for _ in range(2)]
    over_all = [TopK(ratio=0.1), TopK(ratio=0.1, process_set=hvd.global_process_set)]
    assert [int(c._instance) for c in over_all] == [int(first._instance) + 1, int(first._instance) + 2]
    numbers = [c._instance.split(".") for c in in_the_pair]
    assert [part for _, part in numbers] == ["ranks_0_1"] * 2 and int(numbers[1][0]) == int(numbers[0][0]) + 1
