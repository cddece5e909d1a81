"""python -m benchmarks.demo: a small real model trained on 2 ranks, dense against sparsecomm."""
