"""Elastic Horovod with every torch compressor (run by tests/multirank/test_elastic.py under elastic
horovodrun with a host discovery script that reads a file): 2 ranks train, a third joins
(rank 0 rewrites the hosts file), then one is removed again (hosts file back to 2 slots), or
with --fail one rank dies mid-step and the others go on from the last commit. The state is
Horovod's recipe as its docs write it (models and optimizers; --recipe horovod) or
docs/elastic.md's (the compressors too: their residuals roll back with the model).

Each method trains its own copy of the digits MLP in the same job. Every rank prints one line
per reset and, at the end, a digest of each model's parameters and each compressor's steps:
the test checks that every rank printed the same."""

import sys

import common
import horovod.torch as hvd
import torch

import sparsecomm.torch as sct

METHODS = common.elastic_compressors(sct)


def main():
    args = common.elastic_args(recipe="no compression= in the TorchState")
    common.start_torch()
    x, y = common.digits()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    models, optimizers, compressors = {}, {}, {}
    for method, make in METHODS.items():
        models[method] = model = common.torch_model()
        named = [(f"{method}.{n}", p) for n, p in model.named_parameters()]
        compressors[method] = make(dict(named_parameters=named))
        optimizers[method] = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named, compression=compressors[method]
        )
    state = hvd.elastic.TorchState(
        step=0,
        phase="grow",
        mark=0,
        **{f"model_{m}": v for m, v in models.items()},
        **{f"optimizer_{m}": v for m, v in optimizers.items()},
        **({f"compression_{m}": v for m, v in compressors.items()} if args.recipe == "sparsecomm" else {}),
    )
    scenario = common.ElasticScenario(args.hosts, args.fail)
    scenario.log_resets(state, hvd)

    joined = hvd.size() == 3  # this process started in the grown world

    def residual_norm():
        return sum(
            float(s["residual"].abs().sum())
            for c in compressors.values()
            for s in c.state_dict()["parameters"].values()
            if s["residual"] is not None
        )

    def compressor_steps():
        return [sorted((n, s["step"]) for n, s in c.state_dict()["parameters"].items()) for c in compressors.values()]

    def agreed():
        """Before a step: every rank's step and parameters are the same."""
        mine = (state.step, common.digest(p.detach().numpy() for m in models.values() for p in m.parameters()))
        common.same_everywhere(hvd, mine, "parameters", state.step)

    def counted():
        """After a step: every rank's compressor steps are the same (a joiner adopts rank 0's at its
        first compress); with the compressors in the state, each counted exactly the committed steps
        and this one (every tensor is compressed each step; a failed step's partial work was rolled back)."""
        steps = compressor_steps()
        counts = (step for per in steps for _, step in per)
        common.check_counted(hvd, state, steps, counts, exact=args.recipe == "sparsecomm")

    @hvd.elastic.run
    def train(state):
        for rows in scenario.steps(state, hvd, len(x), agreed, joined, residual_norm):
            rows = torch.from_numpy(rows)
            for method, model in models.items():
                optimizers[method].zero_grad()
                torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
                scenario.die_if_due(state, hvd.rank())  # after this method's exchanges started
                optimizers[method].step()
            counted()

    train(state)
    for method, model in models.items():
        digest = common.digest(p.detach().numpy() for p in model.parameters())
        steps = sorted((n, s["step"]) for n, s in compressors[method].state_dict()["parameters"].items())
        loss = torch.nn.functional.cross_entropy(model(x[:256]), y[:256]).item()
        print(
            f"final {method}: rank {hvd.rank()} of {hvd.size()} step {state.step} params {digest} steps {steps} "
            f"loss {loss:.4f}",
            flush=True,
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
