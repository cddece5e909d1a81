"""The tensors one compressor prepares together: a DDP bucket's parameters, an FSDP module's shards,
or one tensor Horovod hands over. Their states and shapes are looked up once, their routes kept
while they stand (sparsecomm.core.bucket), and each route's packs made by one call of the method's
hooks (pack_many): a step's Python is per bucket, not per tensor."""

from ..core.bucket import BucketRoutes, densities_at


class Bucket:
    """A bucket's states (one a tensor, in order) and shapes, its last routes, and what a way in
    keeps of them (`kept`: the DDP hook's wire layout)."""

    def __init__(self, compressor, states, tensors):
        self.states = states
        self.shapes = [(s.name, t.numel(), t.dim(), t.element_size()) for s, t in zip(states, tensors)]
        for shape in self.shapes:
            compressor.planner.check_indexable(*shape)
        self.routes = None
        self.kept = None

    def prepare(self, compressor, tensors, routing):
        """Compressor.prepare of every tensor of the bucket (`routing`: Compressor.routing's): the
        routes, and each tensor's payload (Packed) in order. Each route's tensors are packed by one
        call (Compressor.payloads); then the steps advance."""
        scaling = compressor.loss_scaling
        if scaling is not None:  # before the densities: a rollback restores the step
            scale = scaling.scale()
            for state in self.states:
                scaling.follow(state, scale)
        planner, ranks_to_route = compressor.planner, routing[1]
        densities = densities_at(compressor.method, [state.step for state in self.states])
        routes = self.routes
        if routes is None or not routes.still(planner, densities, ranks_to_route):
            routes = self.routes = BucketRoutes(planner, self.shapes, densities, ranks_to_route)
        payloads = [None] * len(tensors)
        for (route, density), positions in routes.groups.items():
            states = [self.states[i] for i in positions]
            made = compressor.payloads(route, [tensors[i] for i in positions], states, density)
            for position, payload in zip(positions, made):
                payloads[position] = payload
        for position in routes.stepping:
            self.states[position].step += 1
        return routes, payloads

    def stats_rows(self, traffic):
        """Counters.account_bucket's rows: each tensor's name, numel and dense bytes, and its
        traffic (sent elements, sent bytes, received bytes)."""
        return [(name, numel, numel * size, *moved) for (name, numel, _, size), moved in zip(self.shapes, traffic)]
