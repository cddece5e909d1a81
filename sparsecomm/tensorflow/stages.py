"""The per-rank-coordinate exchanges of a TF compressor, in the graph: one branch per stage of
the method's schedule (DGC's warm-up stages may route differently), chosen by the step."""

import tensorflow as tf

from ..core.selection import selected_count
from . import exchange
from .exchange import IN_GRAPH, Landed
from .loss_scaling import nan_first


def per_rank(compressor, tensor, state, overflow=None):
    """(the placeholder Horovod reduces, finish): the exchange ran here; finish(output) is the
    dense gradient (sparsecomm/tensorflow/exchange.py). Every stage's exchange is IN_GRAPH's,
    whose finish is InGraph's, one for all of them."""
    densities = compressor.method.densities()
    wire = compressor.wire(state, tensor)
    routes = []  # each stage's, as it is traced
    stages = [_stage(compressor, tensor, state, density, routes, overflow) for density in densities]
    if len(stages) == 1:
        outcome = stages[0]()
    else:
        stage = compressor.method.stage(state.step.read_value(), minimum=tf.minimum)
        outcome = tf.switch_case(tf.cast(stage, tf.int32), stages)
    values, index, dense, residual, momentum, count, sent, received = outcome
    with tf.control_dependencies(state.updates(residual, momentum, True)):
        placeholder = exchange.placeholder(state.variable_name, wire.process_set)
    placeholder = state.counted(placeholder, count, sent, received)
    if "dense" not in routes:
        dense = None
    elif routes.count("dense") == len(routes):
        values = index = None
    landed = Landed(values, index, dense, residual, wire)
    owner, given = compressor.method.owner, compressor.process_set
    return placeholder, lambda output: IN_GRAPH[routes[-1]].finish(
        exchange.checked_scale(output, owner, wire.process_set, given), landed
    )


def _stage(compressor, tensor, state, density, routes, overflow):
    """One stage as a branch: its route at that density (appended to `routes`), pack and
    exchange, returning tensors only, the same structure in every branch (a stage's values and
    index, or its dense sum, 0 elements where the other kind ran)."""

    def run():
        route = compressor.route(state, tensor, density, record=False)
        routes.append(route)
        if route == "dense":
            packed = compressor.dense_payload(tensor, state)
        else:
            packed = compressor.pack(tensor, state, density)
            if overflow is not None:
                packed = nan_first(packed, overflow)
        started = IN_GRAPH[route].start(packed, compressor.wire(state, tensor, selected_count(density, state.numel)))
        landed = started.context
        residual = landed.residual if landed.residual is not None else state.read_residual()
        values = tf.zeros([0], tensor.dtype) if landed.values is None else landed.values
        index = tf.zeros([0], tf.int32) if landed.index is None else landed.index
        dense = tf.zeros([0], tf.float32) if landed.dense is None else landed.dense
        return values, index, dense, residual, packed.momentum, started.count, started.sent, started.received

    return run
