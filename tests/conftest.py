import os
import sys
import tempfile
from pathlib import Path

# Test the checkout these tests belong to, whatever kernelab the environment has installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# Never write to the user's own ledger: each test process gets a fresh one (tests that need
# another set KERNELAB_LEDGER or pass --ledger themselves).
os.environ["KERNELAB_LEDGER"] = str(Path(tempfile.mkdtemp(prefix="kernelab-tests-")) / "l.sqlite")

import pytest
import torch

from kernelab import _flags
from kernelab._host import torch_threads


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA or ROCm device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shared_dir():
    path = _flags.shared_dir()
    if path is None or not path.is_dir():
        pytest.skip("the shared folder (../shared) is not present")
    return path


@pytest.fixture
def interpret(monkeypatch):
    """Public ops on CPU run their Triton kernels through the interpreter."""
    monkeypatch.setenv("KERNELAB_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module's tests (``pytestmark``): tiny models gain
    nothing from intra-op threads, and on a loaded machine their spinning costs orders of
    magnitude; the tests check results, not speed."""
    with torch_threads(1):
        yield
