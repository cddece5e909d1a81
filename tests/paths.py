"""The checkout's folders, for tests in any subfolder of tests/."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
WORKERS = os.path.join(TESTS, "workers")  # the scripts multi-rank tests launch
