import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import reference`, `import launch`
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "multirank"))  # `import common` (workers' shared code)


def _devices():
    import torch
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=_devices())
def device(request):
    return request.param


def pytest_terminal_summary(terminalreporter):
    """Lists the multi-rank jobs this run executed, so the log shows them whatever the verbosity."""
    from launch import LAUNCHES
    if LAUNCHES:
        terminalreporter.section("multi-rank runs (real horovodrun)")
        for command, status, seconds in LAUNCHES:
            terminalreporter.write_line(f"{command:<55} exit {status}  {seconds:5.1f}s")
