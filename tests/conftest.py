import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import reference`, `import launch`


def _devices():
    import torch
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=_devices())
def device(request):
    return request.param
