"""A self-test of the compiled kernels that needs no source checkout: each op family run on
random data against a plain numpy reference, exact where the math allows.

    python -m sparsecomm.selftest --framework torch|tensorflow [--device cpu|cuda]

Prints one line a check and "N passed, N failed"; exits 1 on a failure. ``python -m
sparsecomm.info`` and the self-check run it in a child process per framework and device."""

import argparse
import sys

import numpy as np

NUMEL, THRESHOLD, K, SEED = 10_000, 1.5, 25, 7


def _inputs():
    rng = np.random.default_rng(SEED)
    return rng.standard_normal(NUMEL).astype(np.float32), rng.standard_normal(NUMEL).astype(np.float32)


def check_block(ops, grad, residual):
    """block_pack: the cyclic block of residual + grad is sent, and leaves the residual."""
    start = int(ops.random_block_start(SEED, 3, 11, NUMEL))
    length = NUMEL // 10
    acc = residual + grad
    block = (start + np.arange(length)) % NUMEL
    values, after = ops.block_pack(grad, residual, start, length)
    expected_after = acc.copy()
    expected_after[block] = 0
    assert 0 <= start < NUMEL, f"start {start} outside [0, {NUMEL})"
    np.testing.assert_array_equal(values, acc[block])
    np.testing.assert_array_equal(after, expected_after)


def check_threshold(ops, grad, residual):
    """accumulate_candidates: every element with |residual + grad| >= threshold, in index order."""
    acc = residual + grad
    values, index, after = ops.accumulate_candidates(grad, residual, THRESHOLD)
    expected = np.flatnonzero(np.abs(acc) >= THRESHOLD)
    np.testing.assert_array_equal(index, expected)
    np.testing.assert_array_equal(values, acc[expected])
    np.testing.assert_array_equal(after, acc)


def check_top_k(ops, grad, residual):
    """select_top: the K candidates of largest magnitude (ties: lower index), in index order."""
    acc = residual + grad
    values, index = ops.select_top(acc, np.arange(NUMEL, dtype=np.int32), K)
    expected = np.sort(np.argsort(-np.abs(acc), kind="stable")[:K])
    np.testing.assert_array_equal(index, expected)
    np.testing.assert_array_equal(values, acc[expected])


def check_unpack(ops, grad, residual):
    """sparse_unpack: duplicates add, times the scale, zero elsewhere."""
    index = np.concatenate([np.arange(0, NUMEL, 7), np.arange(0, NUMEL, 11)]).astype(np.int32)
    values = grad[: index.size]
    expected = np.zeros(NUMEL, np.float32)
    np.add.at(expected, index, values)
    np.testing.assert_array_equal(ops.sparse_unpack(values, index, NUMEL, 0.5), expected * np.float32(0.5))


def check_random_k(ops, grad, residual):
    """random_k_indices: K distinct sorted indices in range, the same for the same seed."""
    first, again = ops.random_k_indices(K, 5), ops.random_k_indices(K, 5)
    np.testing.assert_array_equal(first, again)
    assert first.size == K and np.all(np.diff(first) > 0) and 0 <= first[0] and first[-1] < NUMEL, first


def check_squares(ops, grad, residual):
    """sum_of_squares: float64 sum of x * x."""
    got, expected = ops.sum_of_squares(grad), float(np.sum(grad.astype(np.float64) ** 2))
    assert abs(got - expected) <= 1e-12 * expected, f"{got} != {expected}"


CHECKS = [check_block, check_threshold, check_top_k, check_unpack, check_random_k, check_squares]


def run(ops, device):
    """Runs every check; returns the number that failed."""
    grad, residual = _inputs()
    failed = 0
    for check in CHECKS:
        name = check.__name__[len("check_") :]
        try:
            check(ops, grad, residual.copy())
            print(f"PASS {ops.framework} {device} {name}: {check.__doc__.splitlines()[0]}")
        except Exception as error:  # a failure of any kind is this check's
            failed += 1
            print(f"FAIL {ops.framework} {device} {name}: {type(error).__name__}: {error}")
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    return failed


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m sparsecomm.selftest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--framework", choices=["torch", "tensorflow"], required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    from . import selftest_adapters

    ops = selftest_adapters.for_framework(args.framework, args.device)
    return 1 if run(ops, args.device) else 0


if __name__ == "__main__":
    sys.exit(main())
