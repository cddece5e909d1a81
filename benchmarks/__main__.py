"""python -m benchmarks {kernels,hook-step,e2e,trial,hsdp,hsdp-convergence,convergence,all,report} ...

kernels      every kernel against memcpy and torch.topk in the same run
hook-step    the DDP hook's step on one rank against DDP's own allreduce step, and its cost per
             tensor, on ResNet-50's 161 shapes and on 161 small matrices (benchmarks/hook_step.py)
e2e          step time on an emulated 1 / 10 Gbit/s network and unshaped, for a communication-
             and a compute-heavy model: no exchange (the floor), dense, each method, PyTorch DDP
             (plain, fp16, PowerSGD); --network-model per-host (a namespace and a shaped NIC
             per rank; the default where namespaces work) or shared (one shaped loopback)
trial        a new job's first steps: DGC 0.1% with exchange="auto" and each fixed exchange, each
             from a fresh compressor, on the comm model at 1 Gbit/s (2 ranks, 2 x 2 hosts): the
             mean of the first 30 and 100 steps beside the steady step, and the first 30's mean
             over the fastest fixed exchange's (trial.json in --out)
hsdp         compressed HSDP (FSDP2, register_fsdp_hook) on 2 hosts of 2 ranks at 1 and 10 Gbit/s:
             the floor, native HSDP, DGC 0.1%, Threshold 1%, RandomBlock 1% (benchmarks/hsdp.py)
hsdp-convergence
             the digits task on compressed HSDP (torchrun, 2 replicas of 2 ranks): native HSDP,
             DGC 0.1%, Threshold 1%, RandomBlock 1%, seeds 0 and 1 (benchmarks/hsdp_convergence.py)
convergence  dense vs each method on real data (digits CNN, character- and word-level LMs)
all          kernels, hook-step, e2e, trial, hsdp, convergence and hsdp-convergence, then JSON + PNG figures
             in --out and docs/results.md (`make bench`); e2e also on hosts of several ranks
             (--host-layouts) and hsdp (--hsdp-layouts) where the per-host model runs
report       the figures and docs/results.md again from --out's results.json, measuring nothing
             (--add-e2e RUN.json: first add a `bench e2e --json` run's rows to it, timed apart;
             --add-hsdp / --add-hsdp-convergence RUN.json: a `bench hsdp` / `hsdp-convergence` run's;
             --add-hook-step RUN.json: a `bench hook-step` run's records in place of the page's)
"""

import argparse
import json
import os
import platform
import shlex
import signal
import sys
import time

import torch

from sparsecomm.check import kernels

from . import e2e, first_steps, hook_step, hsdp, hsdp_convergence, network


def _kernels(args):
    return kernels.measure(args, lambda total: _progress("kernels", total, lambda r: f"{r['op']} {r['numel']:,}"))


def _progress(what, total, describe):
    """A progress bar (tqdm) advanced once per record; a line per record without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda record: print(f"[{what}] {describe(record)}", flush=True)
    bar = tqdm(total=total, desc=what, unit="run", file=sys.stdout, dynamic_ncols=True)

    def advance(record):
        bar.set_postfix_str(describe(record)[:60])
        bar.update(1)
        if bar.n >= total:
            bar.close()

    return advance


def _e2e(args):
    records = []
    runs = [(ranks, net, model) for model in args.models for ranks in args.ranks for net in args.networks]
    advance = _progress("e2e", len(runs), lambda r: r)
    for ranks, net, model in runs:
        layout = f"{ranks // args.ranks_per_host} hosts of {args.ranks_per_host}" if args.ranks_per_host > 1 else ranks
        label = f"{model} model, {layout} ranks, {net or 'unshaped'}"
        advance_label = label
        print(f"\n== {label}, {args.network_model} network model", flush=True)
        steps = args.steps or e2e.STEPS[model]
        records += e2e.run_one(
            ranks,
            net,
            model,
            args.methods,
            args.warmup,
            steps,
            network_model=args.network_model,
            rounds=args.rounds or steps,
            ranks_per_host=args.ranks_per_host,
        )
        advance(advance_label)
    print("\n" + e2e.table(records))
    return records


def _host_layouts(args):
    """`bench all`'s cells of hosts of several ranks: the comm model on each of --host-layouts at
    --host-networks, with the flat exchanges, the hierarchical one, dense and the peers."""
    if not args.host_layouts:
        return []
    if args.network_model != "per-host":
        print(f"[e2e] no host layouts {args.host_layouts}: they need the per-host network model")
        return []
    from .e2e_worker import HOST_CELL_ROWS

    records = []
    for hosts, per_host in args.host_layouts:
        cell = dict(vars(args), ranks=[hosts * per_host], ranks_per_host=per_host, networks=args.host_networks)
        records += _e2e(argparse.Namespace(**dict(cell, models=["comm"], methods=list(HOST_CELL_ROWS))))
    return records


def _trial(args):
    """`bench trial`'s cells (and `bench all`'s): the first steps of auto and each fixed exchange
    (first_steps), with a table a cell."""
    if not args.layouts:
        return []
    steps = args.steps or e2e.STEPS[first_steps.MODEL]
    records = first_steps.run(args.layouts, args.network_model, args.first_steps, args.warmup, steps, args.launches)
    print("\n" + first_steps.table(records))
    return records


def _defaults(add_options):
    """The options a sub-command's add_options adds, at their defaults."""
    parser = argparse.ArgumentParser(add_help=False)
    add_options(parser)
    return vars(parser.parse_args([]))


def _hsdp(args):
    """`bench all`'s compressed HSDP rows: `bench hsdp` on each of --hsdp-layouts at --host-networks,
    on the per-host network model alone: the shared one would shape what the ranks of a host send
    each other too (FSDP's gathers and reduce-scatters), which ride the host's own loopback."""
    if not args.hsdp_layouts:
        return []
    if args.network_model != "per-host":
        print(f"[hsdp] no HSDP layouts {args.hsdp_layouts}: they need the per-host network model")
        return []
    records = []
    for hosts, per_host in args.hsdp_layouts:
        options = dict(_defaults(hsdp.add_options), hosts=hosts, ranks_per_host=per_host)
        options.update(networks=[n or "unshaped" for n in args.host_networks], network_model=args.network_model)
        options.update(warmup=args.warmup, steps=args.steps or hsdp.STEPS, rounds=args.rounds)
        records += hsdp.run(argparse.Namespace(**options))
    return records


def _hsdp_convergence(args, report, earlier=None):
    """`bench all`'s compressed HSDP convergence records and where they were trained (None: here):
    those of `earlier` (--convergence-from's results.json) where it has them; else `bench
    hsdp-convergence` with --hsdp-convergence-methods, --epochs and --seeds, where --tasks has its
    task, digits."""
    if earlier and earlier.get("hsdp_convergence"):
        return earlier["hsdp_convergence"], report.convergence_source(
            earlier, args.convergence_from, "hsdp_convergence"
        )
    if not args.hsdp_conv_methods:
        return [], None
    if "digits" not in args.tasks:
        print(f"[hsdp-convergence] no rows: it trains the digits task, not among --tasks {args.tasks}")
        return [], None
    options = dict(_defaults(hsdp_convergence.add_options), methods=args.hsdp_conv_methods)
    options.update(epochs=args.epochs, seeds=args.seeds)
    return hsdp_convergence.run(argparse.Namespace(**options)), None


def _layout(text):
    """--host-layouts' HxR: H hosts of R ranks, both at least 2."""
    hosts, _, per_host = text.partition("x")
    if not (hosts.isdigit() and per_host.isdigit() and int(hosts) >= 2 and int(per_host) >= 2):
        raise argparse.ArgumentTypeError(f"a layout should be HxR (hosts x ranks a host, both >= 2), got {text!r}")
    return int(hosts), int(per_host)


def _convergence(args):
    from . import convergence

    records = []
    advance = _progress("convergence", len(args.tasks), lambda r: r)
    for task in args.tasks:
        print(f"\n== {task}", flush=True)
        records += convergence.run(task, args.np, args.methods, args.epochs, args.seeds)
        advance(task)
    print("\n" + convergence.table(records))
    return records


def _check_layout(parser, args):
    """--ranks-per-host above 1 needs the per-host model and every --ranks a multiple of it."""
    per_host = args.ranks_per_host
    if per_host < 1:
        parser.error(f"--ranks-per-host should be at least 1, got {per_host}")
    if per_host > 1 and args.network_model != "per-host":
        parser.error(f"--ranks-per-host {per_host}: needs the per-host network model, not {args.network_model}")
    uneven = [n for n in args.ranks if n % per_host]
    if uneven:
        parser.error(f"--ranks-per-host {per_host}: every --ranks should be a multiple of it, got {uneven}")


def _network_model(parser, asked):
    """The network model to run: `asked`, else per-host where it can be built here, else shared."""
    if asked == "shared":
        return asked
    why = network.per_host_unavailable()
    if why is None:
        return "per-host"
    if asked == "per-host":
        parser.error(f"--network-model per-host: cannot build it here ({why})")
    print(f"[network] per-host network model unavailable ({why}): using the shared model")
    return "shared"


def _e2e_rows():
    """(the end-to-end rows' names, those run by default), from the worker, which imports Horovod:
    without Horovod, none (main then stops e2e and all with the reason; the kernels run on)."""
    try:
        from .e2e_worker import DEFAULT_ROWS, ROWS
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "horovod":
            raise
        return (), ()
    return ROWS, DEFAULT_ROWS


def _e2e_options(p):
    """The end-to-end bench's options (e2e, all)."""
    rows, default_rows = _e2e_rows()
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--networks", nargs="+", default=["1gbit", "10gbit", "unshaped"])
    p.add_argument("--models", nargs="+", default=["comm", "compute"], choices=e2e.MODELS)
    p.add_argument("--e2e-methods", dest="methods", nargs="+", default=list(default_rows), choices=list(rows))
    p.add_argument(
        "--network-model",
        choices=list(network.MODELS),
        help="per-host: one namespace and one shaped NIC per host of --ranks-per-host ranks "
        "(default where it can be built); shared: all ranks behind one shaped loopback",
    )
    p.add_argument(
        "--ranks-per-host",
        type=int,
        default=1,
        help="per-host model: ranks in each host's namespace, joined by its unshaped loopback "
        "(default 1; 2 with --ranks 4: 2 hosts of 2 ranks, each host one shaped NIC)",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--steps",
        type=int,
        help="timed steps of each row (default: 8 for the comm model, 16 for the compute model, "
        "whose steps are short and noisy; 16 for `all`'s HSDP rows)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="time the rows in this many interleaved turns where they fit in memory together "
        "(default: --steps, one step of each row a turn; 1: one row at a time)",
    )


def _trial_options(p, flag):
    """The first-steps bench's options (trial: --layouts; all: --trial-layouts)."""
    p.add_argument(
        flag,
        dest="layouts",
        type=first_steps.layout,
        nargs="*",
        default=list(first_steps.LAYOUTS),
        help="cells of the first-steps bench: N ranks (a host each) or HxR hosts of R ranks "
        "(default: 2 2x2; none: no such cells)",
    )
    p.add_argument(
        "--first-steps",
        type=int,
        default=100,
        help="the first steps each row with an exchange keeps, all warm-up steps (default: 100)",
    )
    p.add_argument(
        "--launches",
        type=int,
        default=3,
        help="launches a cell, each with the rows in another order; their first steps averaged (default: 3)",
    )
    if flag == "--layouts":  # `bench trial` alone; `bench all` has e2e's
        p.add_argument("--network-model", choices=list(network.MODELS), help="as e2e's (default: per-host if it can)")
        p.add_argument("--warmup", type=int, default=3, help="warm-up steps a row (with an exchange: >= --first-steps)")
        p.add_argument("--steps", type=int, help="timed steps of a row: its steady step (default: the comm model's)")
        p.add_argument("--out", default="results", help="directory of trial.json (default: results)")


def _convergence_options(p):
    """The convergence bench's options (convergence, all)."""
    p.add_argument("--tasks", nargs="+", default=["digits", "charlm", "wordlm"])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--convergence-methods", dest="conv_methods", nargs="+")
    p.add_argument("--epochs", type=int)
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0, 1],
        help="train each method once per seed (initial weights and data order); the records give the "
        "mean and the range (default: 0 1)",
    )


def _hosts_options(a):
    """`bench all`'s options of hosts of several ranks: the e2e cells and compressed HSDP's rows."""
    a.add_argument(
        "--host-layouts",
        type=_layout,
        nargs="*",
        default=[(2, 2), (2, 3)],
        help="hosts of several ranks for the comm model, as HxR (default: 2x2 2x3; none: no such cells)",
    )
    a.add_argument(
        "--host-networks", nargs="+", default=["1gbit", "10gbit"], help="of --host-layouts and --hsdp-layouts"
    )
    a.add_argument(
        "--hsdp-layouts",
        type=_layout,
        nargs="*",
        default=[(2, 2)],
        help="hosts of several ranks for compressed HSDP's rows (`bench hsdp`, the comm model), as HxR "
        "(default: 2x2; none: no such rows)",
    )
    a.add_argument(
        "--hsdp-convergence-methods",
        dest="hsdp_conv_methods",
        nargs="*",
        default=list(hsdp_convergence.ROWS),
        choices=list(hsdp_convergence.ROWS),
        help="`bench hsdp-convergence`'s rows, on the digits task where --tasks has it (default: all; none: no "
        "such rows)",
    )


def _report_options(r):
    """`bench report`'s options: the runs it adds to results.json first."""
    r.add_argument(
        "--add-e2e",
        nargs="+",
        metavar="E2E_JSON",
        help="first add these `bench e2e --json` runs to results.json, beside the run of record (each "
        "replaces an added run of the same cells): rows timed since, without timing the rest again",
    )
    r.add_argument(
        "--add-convergence",
        nargs="+",
        metavar="CONVERGENCE_JSON",
        help="first put these `bench convergence --json` runs' records into results.json, each in place of "
        "the record of the same task and method, the others kept (results.md names every run)",
    )
    for what, same in (("hsdp", "cell (network and layout)"), ("hsdp-convergence", "task, layout and row")):
        r.add_argument(
            f"--add-{what}",
            nargs="+",
            metavar="RUN_JSON",
            help=f"first put these `bench {what} --json` runs' records into results.json, each in place of those "
            f"of the same {same}, the others kept (results.md names every run)",
        )
    r.add_argument(
        "--add-hook-step",
        metavar="RUN_JSON",
        help="first replace results.json's hook-step records with those of a `bench hook-step --json` run "
        "(results.md names the run that timed them)",
    )
    r.add_argument(
        "--convergence-from",
        metavar="JSON",
        help="first replace results.json's convergence records with those of a `bench convergence --json` "
        "run or another run's results.json (results.md names the run that trained them)",
    )


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels", help="time every kernel against memcpy and torch.topk in the same run")
    hs = sub.add_parser("hook-step", help="the DDP hook's step and cost per tensor against DDP's own, on one rank")
    e = sub.add_parser("e2e", help="end-to-end step time on emulated networks")
    t = sub.add_parser("trial", help="the first steps of exchange=auto beside each fixed exchange's")
    h = sub.add_parser("hsdp", help="compressed HSDP's step time on emulated hosts of several ranks")
    hsdp.add_options(h)
    hc = sub.add_parser("hsdp-convergence", help="compressed HSDP's accuracy on the digits task")
    hsdp_convergence.add_options(hc)
    c = sub.add_parser("convergence", help="dense vs each method on real data")
    a = sub.add_parser(
        "all",
        help="kernels + hook-step + e2e + trial + hsdp + convergence + hsdp-convergence, JSON/PNG in --out, "
        "docs/results.md",
    )
    r = sub.add_parser("report", help="figures and docs/results.md from a recorded run (--out/results.json)")
    for p in (k, a):
        kernels.add_options(p)
    for p in (hs, a):
        hook_step.add_options(p)
    for p in (e, a):
        _e2e_options(p)
    _trial_options(t, "--layouts")
    _trial_options(a, "--trial-layouts")
    _hosts_options(a)
    for p in (c, a):
        _convergence_options(p)
    for p in (k, hs, e, c):
        p.add_argument("--json", help="write the records here")
    a.add_argument("--out", default="results", help="directory for JSON and PNG (default: results)")
    r.add_argument(
        "--out", default="docs/results", help="directory of results.json and the figures (default: docs/results)"
    )
    for p in (a, r):
        p.add_argument("--results-md", default="docs/results.md")
    a.add_argument(
        "--convergence-from",
        metavar="RESULTS_JSON",
        help="take the convergence records (and the HSDP convergence records, where it has them) of another "
        "run's results.json instead of training again (results.md says so)",
    )
    _report_options(r)
    return parser


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _report(args, report):
    """`bench report`: results.json with the runs it adds, then the figures and results.md."""
    with open(os.path.join(args.out, "results.json")) as f:
        results = json.load(f)
    for added in args.add_e2e or ():
        with open(added) as f:
            results = report.add_run(results, json.load(f))
    if args.convergence_from:
        with open(args.convergence_from) as f:
            results = report.with_convergence_of(results, json.load(f), args.convergence_from)
    for added in args.add_convergence or ():
        with open(added) as f:
            results = report.with_convergence_added(results, json.load(f), added)
    if args.add_hook_step:
        with open(args.add_hook_step) as f:
            results = report.with_hook_step_of(results, json.load(f), args.add_hook_step)
    hsdp_runs = [("hsdp", added) for added in args.add_hsdp or ()]
    hsdp_runs += [("hsdp_convergence", added) for added in args.add_hsdp_convergence or ()]
    for key, added in hsdp_runs:
        with open(added) as f:
            results = report.with_hsdp_added(results, key, json.load(f), added)
    if args.add_e2e or args.convergence_from or args.add_convergence or hsdp_runs or args.add_hook_step:
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        print(f"updated {args.out}/results.json")
    report.write(results, args.out, args.results_md)
    print(
        f"wrote {args.out}/e2e_speedup.png, {args.out}/convergence.png, {args.out}/scaling.png and "
        f"{args.results_md} from {args.out}/results.json"
    )


def _trial_run(args, report, commit, started):
    """`bench trial`: its cells, then trial.json in --out."""
    records = _trial(args)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "trial.json")
    with open(path, "w") as f:
        json.dump(
            {
                "machine": report.machine(),
                "command": report.relative_command("python -m benchmarks " + shlex.join(sys.argv[1:])),
                "commit": commit,
                "minutes": (time.time() - started) / 60,
                "first_steps": args.first_steps,
                "records": records,
            },
            f,
            indent=1,
        )
    print(f"\nwrote {path}")


def _all(args, report, commit, started):
    """`bench all` (make bench): every bench, results.json, the figures and results.md."""
    os.makedirs(args.out, exist_ok=True)
    command = report.relative_command("python -m benchmarks " + " ".join(map(shlex.quote, sys.argv[1:])))
    results = {
        "machine": report.machine(),
        "command": command,
        "commit": commit,
        "kernels": _kernels(args),
        "hook_step": hook_step.run(args),
    }
    results["e2e"] = _e2e(args) + _host_layouts(args)
    results["hsdp"] = _hsdp(args)
    results["trial"] = _trial(args)
    args.methods = args.conv_methods
    earlier = None
    if args.convergence_from:
        with open(args.convergence_from) as f:
            earlier = json.load(f)
        results["convergence"] = earlier["convergence"]
        results["convergence_from"] = report.convergence_source(earlier, args.convergence_from)
    else:
        results["convergence"] = _convergence(args)
    results["hsdp_convergence"], source = _hsdp_convergence(args, report, earlier)
    if source:
        results["hsdp_convergence_from"] = source
    results["minutes"] = (time.time() - started) / 60
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    report.write(results, args.out, args.results_md)
    print(
        f"\nwrote {args.out}/results.json, {args.out}/e2e_speedup.png, {args.out}/convergence.png and "
        f"{args.results_md} ({results['minutes']:.1f} min)"
    )


def main():
    # a SIGTERM unwinds like Ctrl-C, so the network namespaces and ranks are removed on the way out
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = _parser()
    args = parser.parse_args()
    if args.command in ("e2e", "trial", "hsdp", "all") and not _e2e_rows()[0]:
        parser.error(f"{args.command}: the end-to-end benchmark needs Horovod (python -m sparsecomm.install_horovod)")
    if args.command == "hsdp":  # its own layout of hosts: no --ranks
        args.network_model = _network_model(parser, args.network_model)
    elif hasattr(args, "networks"):
        args.networks = [None if n == "unshaped" else n for n in args.networks]
        if hasattr(args, "host_networks"):
            args.host_networks = [None if n == "unshaped" else n for n in args.host_networks]
        args.network_model = _network_model(parser, args.network_model)
        _check_layout(parser, args)
    elif args.command == "trial":
        args.network_model = _network_model(parser, args.network_model)
    if args.command == "convergence":
        args.methods = args.conv_methods

    started = time.time()
    from . import report

    commit = report.code_version()  # of the code that runs, before anything changes the checkout
    if args.command == "report":
        return _report(args, report)
    if args.command == "all":
        return _all(args, report, commit, started)
    if args.command == "trial":
        return _trial_run(args, report, commit, started)
    if args.command == "kernels":
        records = _kernels(args)
    elif args.command == "hook-step":
        records = hook_step.run(args)
    elif args.command == "e2e":
        records = _e2e(args)
    elif args.command == "hsdp":
        records = hsdp.run(args)
    elif args.command == "hsdp-convergence":
        records = hsdp_convergence.run(args)
    else:
        records = _convergence(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": {"python": platform.python_version(), "torch": torch.__version__},
                    "command": report.relative_command("python -m benchmarks " + shlex.join(sys.argv[1:])),
                    "commit": commit,
                    "minutes": (time.time() - started) / 60,
                    "records": records,
                },
                f,
                indent=1,
            )
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
