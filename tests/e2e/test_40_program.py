"""A user's own DDP program under train.yml (train_program, train_code_dir), on the sandbox.

The program is examples/ddp_linear/train_ddp.py: plain torch.distributed on gloo with a
DistributedSampler and DDP, nothing of the trainer package. It runs from a code directory on
the controller (a copy the test may edit), on every sandbox node, with the agents' guarantees:
the frozen code copy in the run directory, a killed rank tearing the run down with its host
named, a resumed run keeping its frozen copy, and a missing program refused up front. The
first run is in a user's own image from the cluster registry (pulled where missing), carries
a token in train_env and is followed at -vvv: the token is shown nowhere, and nothing in the
run directory is world-readable.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from site_fixtures import figure
from test_30_train import containers, gone_after, run_file, run_id, summary, train, wait_for
from time_bounds import within
from train_fixtures import SHARED, STAMP

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_linear"
SCRIPT = "train_ddp.py"


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("user-code") / "ddp_linear"
    shutil.copytree(EXAMPLE, target)
    return target


def program(code: Path, *args: str) -> list[str]:
    return ["-e", f"train_program={SCRIPT}", "-e", f"train_code_dir={code}",
            "-e", json.dumps({"train_program_args": list(args)})]  # fmt: skip


# A token in train_env, as a user passes one (issue 27 item 7): the run is followed at -vvv.
SECRET = f"e2e-token-{STAMP}-5c1e"


@pytest.fixture(scope="module")
def user_image(cluster: Any) -> Iterator[dict]:
    """A user's own image, made FROM the training image on the registry host and pushed to the
    cluster registry with docker push (site.yml set it up; docs/training.md's steps); no node
    holds it before the run that names it. Its push's output and both images' manifests."""
    node1 = cluster.nodes[0]
    base = cluster.ssh(node1, "cat /etc/ddpfleet/trainer_image").stdout.strip()
    user = f"{base.split('/')[0]}/e2e/user-{STAMP}:1"
    build = cluster.ssh(
        node1,
        f"printf 'FROM {base}\\nLABEL io.ddpfleet.e2e=user-image\\n' | docker build -q -t {user} -",
    )
    assert build.returncode == 0, build.stderr
    start = time.monotonic()
    push = cluster.ssh(node1, f"docker push {user}", timeout=300)
    pushed_s = time.monotonic() - start
    assert push.returncode == 0, push.stderr
    figure(
        f"docker push of an image FROM the training image, on the registry host: {pushed_s:.1f} s"
    )
    layers = {}
    for ref in (base, user):
        shown = cluster.ssh(node1, f"docker manifest inspect {ref}")
        assert shown.returncode == 0, shown.stderr
        layers[ref] = [layer["digest"] for layer in json.loads(shown.stdout)["layers"]]
    cluster.ssh(node1, f"docker rmi {user}")
    yield {"ref": user, "push": push.stdout, "layers": layers[user], "base_layers": layers[base]}
    for node in cluster.nodes:
        cluster.ssh(node, f"docker rmi {user}")


@pytest.fixture(scope="module")
def completed(cluster: Any, code_dir: Path, user_image: dict) -> dict:
    """The program from a code directory, in the user's image, with a token, followed at -vvv:
    one run for the code copy, the user image's pull, and the secret's hiding."""
    rid = run_id("prog")
    secret = json.dumps({"train_env": {"DDPFLEET_E2E_TOKEN": SECRET}})
    run = train(
        cluster, rid, "-e", f"train_image={user_image['ref']}",
        *program(code_dir, "--epochs", "2"), "-e", secret, "-vvv",
    )  # fmt: skip
    return {"rid": rid, "run": run}


def test_user_program_runs_on_every_node_and_completes(cluster: Any, completed: dict) -> None:
    rid, run = completed["rid"], completed["run"]
    assert run.rc == 0, run.tail()
    data = summary(cluster, rid)
    assert (data["status"], data["program"], data["world_size"]) == ("completed", SCRIPT, 3)
    assert {h: r["exit_code"] for h, r in data["hosts"].items()} == {
        n.name: 0 for n in cluster.nodes
    }
    results = [json.loads(run_file(cluster, rid, f"result-{r}.json")) for r in range(3)]
    assert {r["world_size"] for r in results} == {3}
    assert len({r["digest"] for r in results}) == 1, results  # DDP kept the replicas equal
    assert results[0]["steps"] == 2 * 22  # ceil(ceil(1024 / 3) / 16) batches per rank and epoch
    assert f"program {SCRIPT}: status completed, world size 3" in run.stdout
    assert "epoch 1: loss" in run.stdout  # the report's tail of node rank 0's log


def test_run_directory_holds_the_frozen_code_copy(cluster: Any, completed: dict) -> None:
    rid = completed["rid"]
    assert run_file(cluster, rid, f"code/{SCRIPT}") == (EXAMPLE / SCRIPT).read_text()
    config = json.loads(run_file(cluster, rid, "config.json"))
    assert (config["program"], config["program_args"]) == (SCRIPT, ["--epochs", "2"])


def test_a_train_env_token_is_never_shown_nor_world_readable(cluster: Any, completed: dict) -> None:
    rid, run = completed["rid"], completed["run"]
    assert run.rc == 0, run.tail()
    assert SECRET not in run.stdout + run.stderr  # at -vvv
    config = run_file(cluster, rid, "config.json")
    assert SECRET not in config
    assert json.loads(config)["options"]["train_env"] == {"DDPFLEET_E2E_TOKEN": "(hidden)"}
    run_dir = f"{SHARED}/runs/{rid}"
    modes = cluster.ssh(cluster.nodes[0], f"stat -c '%a %n' {run_dir}/config.json {run_dir}/code")
    assert modes.stdout.split() == ["640", f"{run_dir}/config.json", "750", f"{run_dir}/code"]
    # what the agents, the ranks and Ansible wrote (lib/: the agent's own code, public)
    readable = cluster.ssh(
        cluster.nodes[0], f"find {run_dir} -type f -perm /o=r ! -path '{run_dir}/lib/*'"
    )
    assert readable.returncode == 0, readable.stderr
    assert readable.stdout.split() == [], readable.stdout
    found = cluster.ssh(cluster.nodes[0], f"grep -rl -- {SECRET} {run_dir}")
    assert found.stdout.split() == [], found.stdout
    # the agents' key for this attempt: the owner's alone, and shown nowhere either
    key = cluster.ssh(
        cluster.nodes[0], f"stat -c '%a %u' {run_dir}/agent.key; cat {run_dir}/agent.key"
    )
    mode, key_text = key.stdout.split("\n", 1)
    assert mode == "600 2000", key.stdout
    assert len(key_text.strip()) == 64
    assert key_text.strip() not in run.stdout + run.stderr


def test_user_program_reports_progress_through_the_helper(completed: dict) -> None:
    # the example writes heartbeats with ddpfleet_heartbeat (on its PYTHONPATH under train.yml)
    assert "run " + completed["rid"] + ": step " in completed["run"].stdout


@pytest.fixture(scope="module")
def killed(cluster: Any, code_dir: Path) -> dict:
    rid = run_id("progkill")
    victim = cluster.nodes[2]
    run = train(cluster, rid, "-e", "train_follow=false", "-e", "train_restarts=0",
                *program(code_dir, "--epochs", "100", "--step-sleep", "0.2"))  # fmt: skip
    assert run.rc == 0, run.tail()
    wait_for(cluster, rid, None, step=3)
    box = f"docker exec ddpfleet-{rid}-{victim.name}"
    seen = {  # what a run container may touch of the shared storage
        "write_datasets": cluster.ssh(victim, f"{box} touch {SHARED}/datasets/e2e-probe"),
        "runs": cluster.ssh(victim, f"{box} ls {SHARED}/runs"),
        "write_run_dir": cluster.ssh(victim, f"{box} touch {SHARED}/runs/{rid}/probe"),
    }
    # the rank only, not its container: its pid from the heartbeat the helper writes
    beat = cluster.ssh(victim, f"{box} sh -c 'cat /tmp/ddpfleet-heartbeat-*/rank-2.json'")
    assert beat.returncode == 0, beat.stderr
    pid = json.loads(beat.stdout)["pid"]
    kill = cluster.ssh(victim, f"{box} python -c 'import os; os.kill({pid}, 9)'")  # no kill(1)
    assert kill.returncode == 0, kill.stderr
    gone_s = gone_after(cluster, rid, time.monotonic(), 60)
    figure(f"user program's rank killed -> every container gone: {gone_s:.1f} s")
    return {"rid": rid, "victim": victim, "gone_s": gone_s, "seen": seen}


def test_killed_rank_of_a_user_program_tears_down_and_names_the_host(
    cluster: Any, killed: dict
) -> None:
    assert killed["gone_s"] <= within(15)
    data = summary(cluster, killed["rid"])
    assert data["status"] == "failed"
    assert (data["failure"]["host"], data["failure"]["rank"]) == (killed["victim"].name, 2)
    assert data["failure"]["exit_code"] == -9, data["failure"]
    assert data["hosts"][killed["victim"].name]["outcome"] == "failed"


def test_run_containers_see_datasets_read_only_and_only_their_own_run(killed: dict) -> None:
    seen = killed["seen"]
    assert seen["write_datasets"].returncode != 0
    assert "Read-only file system" in seen["write_datasets"].stderr
    assert seen["runs"].stdout.split() == [killed["rid"]], seen["runs"].stdout
    assert seen["write_run_dir"].returncode == 0, seen["write_run_dir"].stderr


def test_resumed_user_program_keeps_its_frozen_code(
    cluster: Any, killed: dict, code_dir: Path
) -> None:
    rid = killed["rid"]
    frozen = run_file(cluster, rid, f"code/{SCRIPT}")
    (code_dir / SCRIPT).write_text(frozen + "\n# changed after the run started\n")
    try:
        run = train(cluster, rid, *program(code_dir, "--epochs", "1"))
    finally:
        (code_dir / SCRIPT).write_text(frozen)
    assert run.rc == 0, run.tail()
    assert f"train_code_dir {code_dir} changed since run {rid} started" in run.stdout
    assert run_file(cluster, rid, f"code/{SCRIPT}") == frozen
    data = summary(cluster, rid)
    assert data["status"] == "completed"
    assert "failure" not in data


def test_program_missing_from_the_image_is_refused_before_anything_starts(cluster: Any) -> None:
    rid = run_id("noprog")
    run = train(cluster, rid, "-e", "train_program=no_such_pkg.train")
    assert run.rc != 0
    assert "train_program no_such_pkg.train is not in image" in run.stdout, run.tail()
    assert "Start the run's container" not in run.stdout
    assert containers(cluster, rid) == {}
    gone = cluster.ssh(cluster.nodes[0], f"test ! -e {SHARED}/runs/{rid}")
    assert gone.returncode == 0, "a refused run left a run directory"
    unlocked = cluster.ssh(cluster.nodes[0], f"test ! -e {SHARED}/runs/{rid}.lock")
    assert unlocked.returncode == 0, "a refused run left its launch lock"


def test_a_user_image_from_the_cluster_registry_is_pulled_and_runs_the_program(
    cluster: Any, completed: dict, user_image: dict
) -> None:
    rid, run = completed["rid"], completed["run"]
    assert run.rc == 0, run.tail()
    pulls = run.stdout.split("TASK [trainer_run : Pull train_image where it is missing]")[1]
    assert all(f"changed: [{n.name}]" in pulls.split("TASK [")[0] for n in cluster.nodes), pulls
    assert json.loads(run_file(cluster, rid, "config.json"))["image"] == user_image["ref"]


def test_a_user_image_s_push_sends_none_of_the_training_image_s_layers(user_image: dict) -> None:
    """The training image's layers were pushed uncompressed by site.yml, which told the
    registry host's Docker so: its docker push mounts them in the registry (no gzip, no
    upload), and the user image names them as every node that pulled the training image
    holds them, so the nodes' pulls download nothing of them."""
    # docker push's lines: "<layer id>: <status>", each layer's last one its outcome
    outcome = dict(re.findall(r"^([0-9a-f]{12}): (.+)$", user_image["push"], re.MULTILINE))
    assert outcome, user_image["push"]
    sent = {
        k: v for k, v in outcome.items() if not v.startswith(("Mounted from ", "Layer already"))
    }
    assert sent == {}, user_image["push"]
    assert user_image["layers"] == user_image["base_layers"]  # only a LABEL on top: no layer
