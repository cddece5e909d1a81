"""A bucket's routes: the route and k of each tensor of a bucket (a DDP bucket's parameters, an FSDP
module's shards) at the densities of their steps, decided together and kept while what they depend
on stands: the densities, the ranks to route for and the planner's final routes (Planner.epoch).
The steady state of a training then decides nothing per tensor: a step compares one key."""

from .selection import selected_count


class BucketRoutes:
    """Each tensor's route and k; `shapes`: (name, numel, ndim, element size) a tensor, `densities`
    one a tensor. `groups`: (route, density) -> the positions packed together; `on`: route -> its positions;
    `stepping`: the positions whose step a send advances (every route but dense, unless the method
    counts those)."""

    def __init__(self, planner, shapes, densities, ranks_to_route):
        self.key = (ranks_to_route, densities, planner.epoch)
        self.routes = [planner.route(*shape, density, ranks_to_route) for shape, density in zip(shapes, densities)]
        # (after the routes: the first route auto chooses may start its trial; while it watches or
        # tries, the routes are decided anew each step)
        self.stands = planner.routes_final()
        self.ks = [selected_count(density, shape[1]) for shape, density in zip(shapes, densities)]
        self.groups = {}
        for position, route_and_density in enumerate(zip(self.routes, densities)):
            self.groups.setdefault(route_and_density, []).append(position)
        counts_dense = planner.method.counts_dense_steps
        self.stepping = [i for i, route in enumerate(self.routes) if route != "dense" or counts_dense]
        self.on = {}  # route -> the positions on it, in order
        for position, route in enumerate(self.routes):
            self.on.setdefault(route, []).append(position)

    def still(self, planner, densities, ranks_to_route):
        """Whether these routes stand for a step at `densities` routed for `ranks_to_route`."""
        return self.stands and self.key == (ranks_to_route, densities, planner.epoch)


def densities_at(method, steps):
    """Each step's density, the schedule evaluated once per distinct step (a bucket's steps are
    mostly one), as a tuple."""
    density_at = {step: method.density(step) for step in set(steps)}
    return tuple(map(density_at.__getitem__, steps))
