"""Fixtures shared by the unit tests of the trainer and the diagnostics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Other unit tests import ansible, whose module_utils replace the builtin sys.intern with a
# callable object; torch._dynamo (imported by torchvision) rejects that at import time.
# Import torch's stack once with the builtin in place, then put ansible's patch back.
_patched_intern = sys.intern
sys.intern = getattr(type(_patched_intern), "unpatched_implementation", _patched_intern)
try:
    import torch._dynamo  # noqa: F401
    import torchvision  # noqa: F401
finally:
    sys.intern = _patched_intern

from trainer.make_dataset import write_dataset  # noqa: E402

# The run agent's and the doctor's tests drive timeouts of a few seconds (heartbeats, peers,
# stalls, hangs): all of them count as `wallclock`, which make test runs apart from the rest of
# the unit tier (its 2-rank trainer runs would take the cores those timeouts are measured on).
WALLCLOCK_DIRS = ("agent", "doctor")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.relative_to(here).parts[0] in WALLCLOCK_DIRS:
            item.add_marker(pytest.mark.wallclock)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real JPEG ImageFolder: 3 classes, 8 train and 2 val images each, 40 px."""
    root = tmp_path_factory.mktemp("imagefolder")
    write_dataset(root, classes=3, train_per_class=8, val_per_class=2, size=40)
    return root
