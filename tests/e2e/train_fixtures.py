"""``cluster``: the provisioned sandbox for the training-run modules, and their run names.

Imported into conftest.py (like ``provisioned``), so test_30_train and test_35_faults share
one fixture; after each module it removes this session's containers, runs and data sets.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from typing import Any

import pytest

SHARED = "/mnt/ddpfleet"
STAMP = time.strftime("%H%M%S")
# Short runs: 3 ranks share 2 cores. Each rank logs every step so progress is visible. The
# runs train resnet18 (the sandbox's 64 px images): what these tests prove (supervision,
# faults, resume, data safety) does not depend on the model, and on the 2-core EPYC without
# AVX512 ResNet-50 made the e2e tier alone outlast CI's 90 min. The synthetic run of
# test_30_train still trains ResNet-50, the product's model, end to end.
FAST = ["-e", "train_log_every=1", "-e", "train_omp_num_threads=1", "-e", "train_workers=0"]
FAST += ["-e", "train_arch=resnet18"]
# The sandbox's three nodes share 2 cores, and most modules count the starts of their runs:
# test_46_stragglers turns rebalancing on, with its own false-alarm check.
FAST += ["-e", "train_rebalance=off"]


def run_id(name: str) -> str:
    return f"e2e-{STAMP}-{name}"


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, sandbox: Any) -> Any:
    """The provisioned sandbox (site.yml applied once; the lead's `provisioned` fixture)."""
    # Without the shared fixture, test_20_site (file order) ran site.yml before this module.
    with contextlib.suppress(pytest.FixtureLookupError):
        request.getfixturevalue("provisioned")
    probe = sandbox.ssh(sandbox.nodes[0], "cat /etc/ddpfleet/trainer_image")
    assert probe.returncode == 0, "site.yml has not provisioned the sandbox: " + probe.stderr
    yield sandbox
    for node in sandbox.nodes:  # our containers only (label io.ddpfleet.run_id=e2e-<stamp>-*)
        sandbox.ssh(
            node,
            "docker ps -aq --filter label=io.ddpfleet.run_id | xargs -r docker inspect "
            "--format '{{.Name}} {{index .Config.Labels \"io.ddpfleet.run_id\"}}' "
            f"| awk '$2 ~ /^e2e-{STAMP}-/ {{print $1}}' | xargs -r docker rm -f",
        )
    if not os.environ.get("DDPFLEET_E2E_KEEP_RUNS"):
        sandbox.ssh(
            sandbox.nodes[0], f"rm -rf {SHARED}/runs/e2e-{STAMP}-* {SHARED}/datasets/e2e-{STAMP}*"
        )
    for copy in (sandbox.root / ".cache" / "runs").glob(f"e2e-{STAMP}-*"):  # report.png copies
        shutil.rmtree(copy, ignore_errors=True)
