"""exchange="auto"'s route trial: which sides it tries, how it times them and when it decides.

After the cost model has chosen (sparsecomm.core.plan.AutoRouter), the trial tries the model's
routes (MODEL) on the training itself against every tensor sent by one route (every_tensor
sides): the model rests on estimates that the training can prove wrong. A side is tried only
where it could win: the model's prediction of its step is within PRUNE_MARGIN of the best
side's, or the model's figures were shown wrong by the step it watched (sides_to_try).
The steps then take the sides in turns, timed by a StepClock, in rounds of TRIAL_TURNS turns;
after each round the sides that cannot be kept leave (RouteTrial.contenders), until every turn
agrees on whether each side left beats the model by more than TRIAL_MARGIN, or for
TRIAL_ROUNDS rounds, when the median turn decides (docs/exchanges.md, "Trying the routes").
"""

import collections
import statistics

MODEL = "model"  # the side that routes by the model; the others: every_tensor(route)
WATCH_ROUTE = "allgather"  # how auto routes a tensor while it watches, where it receives fewer bytes than dense
WATCHED = "watched"  # the watched steps' routing, a side of the model's predictions only (plan.watch_route)
SPARSE_ROUTES = ("allgather", "spardl", "hierarchical")  # cost.SPARSE
MOST_SIDES = 2 + len(SPARSE_ROUTES)  # the model's routes, all dense, and every tensor by each sparse route
# Adjacent steps see the machine alike, so a turn's ratios are steadier than medians. After each
# round of TRIAL_TURNS turns the trial decides if every turn agrees; after TRIAL_ROUNDS rounds the
# median turn decides.
TRIAL_TURNS = 4
TRIAL_ROUNDS = 3
TRIAL_STEPS = MOST_SIDES * TRIAL_TURNS * TRIAL_ROUNDS  # the most counted steps
# How much faster than the model's routes an alternative must be to be kept: within it the
# model's routes, which rest on measurements of their own, stand.
TRIAL_MARGIN = 0.03
# A side predicted more than PRUNE_MARGIN times the best side's step is not tried. The model's
# worst miss in the bench's trials put its own routes at 1.55x the best side's step where it
# predicted them fastest (docs/exchanges.md): 2x leaves room for a miss of that size.
PRUNE_MARGIN = 2.0
# The model's routes, where they mix routes, run as the watch's route (every tensor by
# WATCH_ROUTE) unless the model predicts the mix at least MIX_MARGIN faster: in the bench's
# trials a mix never beat a route alone (1.24x, 1.33x and 1.55x the best side), and on 2 x 2
# hosts the model put every sparse side within 0.5% of its mix.
MIX_MARGIN = 0.10


def every_tensor(route):
    """The side of a RouteTrial that sends every tensor auto routes by `route`."""
    return f"all {route}"


def route_of(side):
    """The route of an every_tensor side."""
    return side.removeprefix(every_tensor(""))


ALL_DENSE = every_tensor("dense")
ALL_WATCHED = every_tensor(WATCH_ROUTE)  # warmed by the watch


def sides_to_try(candidates, predicted):
    """(alternatives, warming, ratios) of a RouteTrial among `candidates` (every_tensor sides):
    those whose predicted step (`predicted`: side -> seconds, MODEL and every candidate; None
    where the model's figures are not to be trusted) is within PRUNE_MARGIN of the fastest
    side's; one uncounted step by the model's routes, then one by each tried sparse side that
    has not run yet (the watch ran ALL_WATCHED); ratios: each side's predicted step over the
    fastest one's ({} without predictions)."""
    best = min(predicted.values()) if predicted else None
    ratios = {side: seconds / best for side, seconds in predicted.items()} if predicted else {}
    tried = [side for side in candidates if best is None or ratios[side] <= PRUNE_MARGIN]
    warming = (MODEL, *(side for side in tried if side not in (ALL_DENSE, ALL_WATCHED)))
    return tuple(tried), warming, ratios


class StepClock:
    """Training steps as Horovod's hooks show them: a step begins at its first compress after a
    decompress, and ends at its last decompress. From one end to the next is a whole step (the
    optimizer's update, the forward, the backward with its packs, the wait and the unpacks).
    `ends` holds when the last MOST_SIDES * TRIAL_TURNS + 1 ended steps ended (perf_counter
    seconds), the last one that of step `step - 1`: what a round of the trial needs."""

    def __init__(self):
        self.step, self.ends = 0, collections.deque(maxlen=MOST_SIDES * TRIAL_TURNS + 1)
        self._last = None  # the last decompress of the step under way

    def note_compress(self):
        if self._last is not None:
            self.ends.append(self._last)
            self.step, self._last = self.step + 1, None

    def note_decompress(self, now):
        self._last = now

    def ended(self, step):
        """When `step` ended (one of the last MOST_SIDES * TRIAL_TURNS + 1 ended steps)."""
        return self.ends[len(self.ends) - (self.step - step)]

    def last_step_seconds(self):
        """The seconds of the last ended step (None before two have ended)."""
        return self.ends[-1] - self.ends[-2] if len(self.ends) >= 2 else None


class RouteTrial:
    """Tries the model's routes against `alternatives`, every_tensor sides. From `first`, the
    step that measured, the steps route by each side of `warming` in turn, not counted (each
    pays a route's first use); then the steps take the sides in turns (MODEL, then each
    alternative still in contention), each timed by the StepClock, in rounds of TRIAL_TURNS
    turns. With no alternative it is decided at once: the model's routes."""

    def __init__(self, first, alternatives, warming=(MODEL,), predicted=None, model_route=None):
        self.first, self.alternatives, self.warming = first, tuple(alternatives), tuple(warming)
        self.predicted = dict(predicted or {})  # side -> its predicted step over the fastest side's
        self.model_route = model_route  # where the model's side sends every tensor one way (MIX_MARGIN)
        self.counted_from = first + len(self.warming)
        self.round_start = self.counted_from  # the first step of the round under way
        self.winner = None if self.alternatives else self._as_routed(MODEL)  # once decided
        self.seconds = {side: [] for side in self.sides}  # each counted step's seconds, averaged over the ranks
        self.ratios = {side: [] for side in self.alternatives}  # each turn's alternative / model, every side tried

    @classmethod
    def decided(cls, winner):
        """A trial decided before this process (a restored decision): `winner` routes."""
        trial = cls(0, ())
        trial.winner = winner
        return trial

    @property
    def skipped(self):
        """Each side predicted but not tried, with its predicted ratio."""
        return {side: r for side, r in self.predicted.items() if side != MODEL and side not in self.ratios}

    @property
    def sides(self):
        return (MODEL, *self.alternatives)

    @property
    def round_steps(self):
        return TRIAL_TURNS * len(self.sides)

    @property
    def rounds(self):
        """Rounds whose step times were added."""
        return len(self.seconds[MODEL]) // TRIAL_TURNS

    def arm(self, step):
        """How `step` routes."""
        if self.winner is not None:
            return self.winner
        if step < self.counted_from:
            return self._as_routed(self.warming[step - self.first])
        return self._as_routed(self.sides[(step - self.round_start) % len(self.sides)])

    def _as_routed(self, side):
        """The model's side as it routes: every tensor by model_route where it has one."""
        return every_tensor(self.model_route) if side == MODEL and self.model_route else side

    def round_ended(self, clock):
        """Whether the round under way has ended (checked at every compress: true first at the
        first compress after its last step, while the clock still holds its steps' ends)."""
        return self.winner is None and clock.step >= self.round_start + self.round_steps

    def round_seconds(self, clock):
        """This rank's step seconds of the round just ended, in step order (a turn: MODEL, then
        each alternative)."""
        start = self.round_start  # the StepClock keeps their ends
        return [clock.ended(step) - clock.ended(step - 1) for step in range(start, start + self.round_steps)]

    def add_round(self, seconds):
        """The round's step seconds (round_seconds, averaged over the ranks: the same on every
        rank, and so is the decision). Then drops the sides that cannot be kept (contenders);
        decides when, for each side left, every turn so far agrees on whether it beats the model
        by more than TRIAL_MARGIN, or after TRIAL_ROUNDS rounds; then keeps the side of the
        lowest median turn ratio among those that beat the model by the margin, else the model."""
        n = len(self.sides)
        for i, side in enumerate(self.sides):
            self.seconds[side] += seconds[i::n]
        for i, side in enumerate(self.alternatives, start=1):
            self.ratios[side] += [a / m for m, a in zip(seconds[0::n], seconds[i::n])]
        self.round_start += len(seconds)
        self.alternatives = self.contenders()
        agreed = all(len({r < 1 - TRIAL_MARGIN for r in self.ratios[side]}) == 1 for side in self.alternatives)
        if agreed or self.rounds == TRIAL_ROUNDS:
            beating = [side for side in self.alternatives if self.ratio(side) < 1 - TRIAL_MARGIN]
            self.winner = self._as_routed(min(beating, key=self.ratio, default=MODEL))

    def contenders(self):
        """The alternatives that can still be kept: each beat the model by the margin in some
        turn, and, where a side beat it in every turn (the leader: of those, the lowest median
        ratio), was faster than the leader in some turn. The others' further turns would be paid
        for nothing."""
        beat = {side: [r < 1 - TRIAL_MARGIN for r in self.ratios[side]] for side in self.alternatives}
        always = [side for side in self.alternatives if all(beat[side])]
        leader = min(always, key=self.ratio, default=None)

        def beats_leader(side):
            return (
                leader is None
                or side == leader
                or any(r < lead for r, lead in zip(self.ratios[side], self.ratios[leader]))
            )

        return tuple(side for side in self.alternatives if any(beat[side]) and beats_leader(side))

    def ratio(self, side):
        """The median turn's `side` / model."""
        return statistics.median(self.ratios[side])

    def extra_seconds(self):
        """What the counted steps cost beyond as many steps of the fastest side (its median)."""
        medians = {side: statistics.median(s) for side, s in self.seconds.items() if s}
        counted = sum(len(s) for s in self.seconds.values())
        return sum(sum(s) for s in self.seconds.values()) - counted * min(medians.values(), default=0.0)

    def shown(self, step):
        """What stats() shows of the trial: the side of this step while trying; then the one
        kept, each side's median step seconds, each side's median turn ratio, the steps counted,
        what they cost beyond the fastest side, the sides not tried and each side's predicted
        step over the fastest prediction."""
        if self.winner is None:
            return {"route_trial": self.arm(step)}
        return {
            "route_trial": self.winner,
            "route_trial_seconds": {side: statistics.median(s) for side, s in self.seconds.items() if s},
            "route_trial_ratios": {side: self.ratio(side) for side, ratios in self.ratios.items() if ratios},
            "route_trial_steps": sum(len(s) for s in self.seconds.values()),
            "route_trial_extra_seconds": self.extra_seconds(),
            "route_trial_skipped": self.skipped,
            "route_trial_predicted": dict(self.predicted),
        }
