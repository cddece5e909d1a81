"""The declared seams (docs/contributing.md, "The seams"): every route of the planner has an
exchange in each framework, every exchange implements sparsecomm.core.exchange.Exchange, and
the abstract bases refuse a class that leaves a phase or a hook out."""

import pytest

from sparsecomm.core.compressor import Settings
from sparsecomm.core.exchange import Exchange, Packed
from sparsecomm.core.validate import EXCHANGE_CHOICES

ROUTES = {"dense", "shared"} | (set(EXCHANGE_CHOICES) - {"auto"})  # what Planner.route returns


def test_every_torch_route_has_an_exchange_with_its_phases():
    from sparsecomm.torch.exchange import EXCHANGES, Hierarchical, SparDL

    assert set(EXCHANGES) == ROUTES
    assert all(isinstance(exchange, Exchange) for exchange in EXCHANGES.values())
    assert {route: e.advances for route, e in EXCHANGES.items() if e.advances} == {"spardl": 1, "hierarchical": 2}
    assert isinstance(EXCHANGES["spardl"], SparDL) and isinstance(EXCHANGES["hierarchical"], Hierarchical)


def test_every_tf_route_has_an_exchange_carried_by_horovod_or_run_in_the_graph():
    pytest.importorskip("tensorflow")
    from sparsecomm.tensorflow.exchange import CARRIED, IN_GRAPH, InGraph

    assert set(CARRIED) | set(IN_GRAPH) == ROUTES
    assert set(CARRIED) == {"dense", "shared"}  # a warm-up stage that goes dense runs in the graph too
    assert all(isinstance(e, Exchange) and not e.advances for e in [*CARRIED.values(), *IN_GRAPH.values()])
    assert all(isinstance(e, InGraph) for e in IN_GRAPH.values())


def test_an_exchange_without_finish_is_refused():
    class Unfinished(Exchange):
        def start(self, packed, wire):
            return packed, None

    with pytest.raises(TypeError, match="finish"):
        Unfinished()


def test_an_exchange_without_later_phases_refuses_to_advance():
    class OnePhase(Exchange):
        def start(self, packed, wire):
            return packed, None

        def finish(self, output, context):
            return output

    with pytest.raises(NotImplementedError, match="OnePhase has no phase 0"):
        OnePhase().advance(None, 0)


def test_a_bucket_part_without_finish_is_refused():
    from sparsecomm.torch.ddp_parts import BucketPart

    class Unfinished(BucketPart):
        def add(self, grad, *payload):
            return 0, 0, 0

        def start(self):
            return []

    with pytest.raises(TypeError, match="finish"):
        Unfinished()


def test_a_method_class_without_pack_is_refused_and_dense_payload_defaults_to_the_gradient():
    from sparsecomm.core import methods
    from sparsecomm.torch.compression import Compressor

    class NoPack(Compressor):
        method_type = methods.TopK

    with pytest.raises(TypeError, match="pack"):
        NoPack(ratio=0.1)
    assert "pack" in Settings.__abstractmethods__
    assert Settings.dense_payload(None, "gradient", None) == Packed("gradient")
