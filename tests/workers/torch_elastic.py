"""Elastic Horovod with every torch compressor (run by tests/multirank/test_elastic.py under elastic
horovodrun with a host discovery script that reads a file): 2 ranks train, a third joins
(rank 0 rewrites the hosts file), then one is removed again (hosts file back to 2 slots), or
with --fail one rank dies mid-step and the others go on from the last commit. The state is
Horovod's recipe as its docs write it (models and optimizers; --recipe horovod) or
docs/elastic.md's (the compressors too: their residuals roll back with the model).

Each method trains its own copy of the digits MLP in the same job. Every rank prints one line
per reset and, at the end, a digest of each model's parameters and each compressor's steps:
the test checks that every rank printed the same."""

import argparse
import sys

import common
import horovod.torch as hvd
import torch

import sparsecomm.torch as sct

METHODS = {
    "DGC": lambda named: sct.DGC(ratio=0.05, warmup_steps=4, named_parameters=named, **common.EVERY),
    "Threshold": lambda named: sct.Threshold(ratio=0.05, exchange="spardl", named_parameters=named, **common.EVERY),
    "TopK": lambda named: sct.TopK(ratio=0.05, exchange="allgather", named_parameters=named, **common.EVERY),
    "RTopK": lambda named: sct.RTopK(ratio=0.05, seed=3, exchange="allgather", named_parameters=named, **common.EVERY),
    "RandomK": lambda named: sct.RandomK(ratio=0.05, seed=5, named_parameters=named, **common.EVERY),
    "RandomBlock": lambda named: sct.RandomBlock(ratio=0.05, seed=7, named_parameters=named, **common.EVERY),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True, help="the file the host discovery script prints")
    parser.add_argument("--fail", action="store_true", help="shrink by a rank dying mid-step, not by discovery")
    parser.add_argument(
        "--recipe",
        choices=("horovod", "sparsecomm"),
        default="sparsecomm",
        help="horovod: no compression= in the TorchState",
    )
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    x, y = common.digits()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    models, optimizers, compressors = {}, {}, {}
    for method, make in METHODS.items():
        models[method] = model = common.torch_model()
        named = [(f"{method}.{n}", p) for n, p in model.named_parameters()]
        compressors[method] = make(named)
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
    state.register_reset_callbacks(
        [lambda: print(f"reset: rank {hvd.rank()} of {hvd.size()} at step {state.step}", flush=True)]
    )

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
        if args.recipe == "sparsecomm" and any(step != state.step + 1 for per in steps for _, step in per):
            raise AssertionError(f"rank {hvd.rank()}: compressor steps {steps} after step {state.step}")
        common.same_everywhere(hvd, steps, "compressor steps", state.step)

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
