"""The checks of a run request, on the controller, before any host is contacted: the first
problem in one line naming the option, or ''. ``ansible-playbook train.yml`` runs them in one
call of roles/trainer_run's ``ddpfleet_run_validate`` action (tasks/validate.yml, run_once);
tests/unit/test_run_validate.py calls them in-process.

In order: run_id; train_* names that are not declared (a typo must not silently do nothing);
each option's type, choices, range and finiteness (``trainer.options``, the one declaration);
a --limit that leaves trainers out; the data source, node rank 0 and the ports;
train_balance and each trainer's train_cpus; train_program and train_code_dir; the scheduler.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Mapping

from trainer.options import OPTIONS, as_bool, finite, problem
from trainer.shares import balance_mode

# Leading letter or digit: ddpfleet's own files under runs/ start with a dot (.preflight-*).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
RUN_ID_RULE = "1-64 letters, digits, -, _ or ., starting with a letter or digit"
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*")
UNDEFINED = object()


def run_id_problem(run_id: object) -> str:
    if run_id is UNDEFINED:
        return f"run_id is required: add -e run_id=<id> ({RUN_ID_RULE})"
    if not RUN_ID.fullmatch(str(run_id)):
        return f"invalid run_id {json.dumps(str(run_id))}: use {RUN_ID_RULE}"
    return ""


def unknown_problem(names: object) -> str:
    """The typo guard: a train_* variable that no option declares."""
    unknown = sorted(n for n in names if str(n).startswith("train_") and n not in OPTIONS)  # type: ignore[attr-defined]
    if not unknown:
        return ""
    known = "see inventory/sample/group_vars/all/train.yml"
    return f"unknown train option(s) {', '.join(unknown)}; known: {known}"


def option_problems(values: Mapping) -> list[str]:
    """Each declared option's value against its declaration (type, choices, range, finite)."""
    return [p for name in OPTIONS if (p := problem(name, values[name]))]


def limit_problem(trainers: list[str], play_hosts: list[str]) -> str:
    """The world size counts every trainer: a run on some of them would wait for the others."""
    left_out = [h for h in trainers if h not in play_hosts]
    if not left_out:
        return ""
    return (
        f"a run spans every host of the trainers group, and --limit leaves out "
        f"{', '.join(left_out)}: drop --limit, or train on fewer hosts with an inventory whose "
        "trainers group lists only them"
    )


def data_dir(values: Mapping, shared_mount: str) -> str:
    """train_data_dir resolved: relative to <shared_mount>/datasets, normalised."""
    given = str(values["train_data_dir"])
    path = given if posixpath.isabs(given) else f"{shared_mount}/datasets/{given}"
    return posixpath.normpath(path)


def placement_problem(values: Mapping, trainers: list[str], shared_mount: str) -> str:
    """The data source (a user's program takes its data from its own arguments), node rank 0
    and the two ports rank 0 listens on."""
    own_program = bool(values["train_program"])
    synthetic = as_bool(values["train_synthetic"])
    given = str(values["train_data_dir"])
    datasets = f"{shared_mount}/datasets"
    if not own_program and synthetic == bool(given):
        return f"give exactly one of train_data_dir=<dir under {datasets}> or train_synthetic=true"
    # the resolved path: a relative ../../etc must not climb out of <shared_mount>/datasets
    if (
        not own_program
        and not synthetic
        and not data_dir(values, shared_mount).startswith(datasets + "/")
    ):
        where = "the only data the run containers see, read-only"
        return f"train_data_dir {given} is not under {datasets} ({where})"
    master = str(values["train_master_host"])
    if master and master not in trainers:
        return f"train_master_host {master} is not in the trainers group"
    port = int(finite(values["train_master_port"]) or 0)
    agent = int(finite(values["train_agent_port"]) or 0) or port + 1
    if agent > 65535 or agent == port:
        return (
            f"train_master_port {port} and the agent port {agent} must be two different ports "
            "up to 65535 (train_agent_port 0 means train_master_port + 1)"
        )
    metrics = int(finite(values["train_metrics_port"]) or 0) or port + 2
    if metrics > 65535 or metrics in (port, agent):
        return (
            f"the metrics port {metrics} must differ from train_master_port {port} and the agent "
            f"port {agent}, up to 65535 (train_metrics_port 0 means train_master_port + 2)"
        )
    return ""


def balance_problems(balance: object, hosts: list[str]) -> list[str]:
    """Why train_balance cannot be used with these trainers (empty: it can)."""
    if balance_mode(balance) != "map":
        return []
    if not isinstance(balance, Mapping):
        what = "off, auto or a mapping of every trainer to a weight"
        return [f"train_balance must be {what} (got {balance!r})"]
    problems = []
    unknown = sorted(str(h) for h in balance if h not in hosts)
    if unknown:
        problems.append(f"train_balance names {', '.join(unknown)}, not in the trainers group")
    missing = [h for h in hosts if h not in balance]
    if missing:
        problems.append(
            f"train_balance gives no weight for {', '.join(missing)} (weigh every trainer)"
        )
    for host in hosts:
        if host in balance and ((w := finite(balance[host])) is None or w <= 0):
            got = balance[host]
            problems.append(
                f"train_balance weight of {host} must be a finite number > 0 (got {got!r})"
            )
    return problems


def cpus_problems(hostvars: Mapping, hosts: list[str]) -> list[str]:
    """Each trainer's train_cpus (a host variable: a Docker CPU quota; 0: none) in range
    (whether the host has that many CPUs, its preflight checks)."""
    option = OPTIONS["train_cpus"]
    problems = []
    for host in hosts:
        value = hostvars[host].get("train_cpus", option.default)
        cpus = finite(value)
        if cpus is None or not option.min <= cpus <= option.max:  # type: ignore[operator]
            problems.append(
                f"train_cpus of {host} must be a finite number from {option.min:g} to "
                f"{option.max:g} (got {value!r})"
            )
    return problems


def _is_script(program: str) -> bool:
    return re.fullmatch(r".*[.]py", program) is not None


def program_problem(program: str, code_dir: str) -> str:
    """train_program names a module or a script (a script in the image by its absolute path);
    train_code_dir needs a program."""
    if not program:
        if not code_dir:
            return ""
        return (
            f"train_code_dir {code_dir} is set but train_program is not: name the module "
            "or script to run"
        )
    script = _is_script(program)
    script_ok = script and "\0" not in program and ".." not in program.split("/")
    if not (MODULE.fullmatch(program) or script_ok):
        return (
            f"invalid train_program {json.dumps(program)}: give a Python module (pkg.train) "
            "or a script path ending in .py"
        )
    if not code_dir and script and not os.path.isabs(program):
        return (
            f"train_program {program}: a script in the image needs an absolute path "
            "(or give train_code_dir)"
        )
    return code_dir_problem(program, code_dir) if code_dir else ""


def code_dir_problem(program: str, code_dir: str) -> str:
    """The program must be in train_code_dir on the controller (without it, the preflight
    looks for it in the image)."""
    if not os.path.isdir(code_dir):
        return f"train_code_dir {code_dir} is not a directory on the controller"
    if os.path.isabs(program):
        return f"train_program {program}: a script in train_code_dir needs a path relative to it"
    base = f"{code_dir.rstrip('/')}/"
    module = base + program.replace(".", "/")
    looked = [base + program] if _is_script(program) else [f"{module}.py", f"{module}/__main__.py"]
    if not any(os.path.isfile(p) for p in looked):
        return (
            f"train_program {program} is not in train_code_dir (looked for {' and '.join(looked)})"
        )
    return ""


def hosts_problems(values: Mapping, trainers: list[str], hostvars: Mapping) -> list[str]:
    """Unequal hosts: weights for every trainer and nothing else, a quota per host, and no
    weights for a user's program (it splits its own batches)."""
    problems = balance_problems(values["train_balance"], trainers)
    problems += cpus_problems(hostvars, trainers)
    problems += [p for p in [shrink_problem(values, len(trainers))] if p]  # fmt: skip
    if values["train_program"] and balance_mode(values["train_balance"]) != "off":
        problems.append(
            "train_balance needs ddpfleet's trainer: a user's program (train_program) splits "
            "its own batches"
        )
    return problems


def shrink_problem(values: Mapping, trainers: int) -> str:
    """train_min_hosts: at most the trainers there are, and restarts to shrink with."""
    wanted = int(values["train_min_hosts"])  # well-formed by now, but -e gives strings
    if not wanted:
        return ""  # every trainer: no shrinking
    if wanted > trainers:
        return f"train_min_hosts {wanted} is more than the run's {trainers} trainer(s)"
    if not int(values["train_restarts"]):
        return f"train_min_hosts {wanted} needs train_restarts of 1 or more (it is 0)"
    return ""


def scheduler_problem(values: Mapping, slurm_enabled: object) -> str:
    """train_scheduler=slurm needs the Slurm cluster site.yml makes; the job's own options
    mean nothing to a direct run, which would silently run without them."""
    if values["train_scheduler"] == "slurm":
        if as_bool(slurm_enabled):
            return ""
        return (
            "train_scheduler=slurm needs the Slurm cluster site.yml makes: set slurm_enabled: "
            "true in the inventory and run site.yml"
        )
    for name in ("train_partition", "train_time_limit"):
        if values[name] not in ("", 0, "0"):
            return f"{name} applies to train_scheduler=slurm only (this run is direct)"
    return ""


def dump_problem(value: object) -> str:
    """status.yml/stop.yml's ``-e dump=...``: a boolean."""
    if isinstance(value, bool) or str(value).lower() in ("true", "false", "yes", "no", "1", "0"):
        return ""
    return f"invalid dump {json.dumps(str(value))}: use -e dump=true, or leave it out"


def first_problem(
    variables: Mapping, trainers: list[str], play_hosts: list[str], hostvars: Mapping
) -> str:
    """The first thing wrong with a run request, in one line ('' when nothing is). Each step
    relies on the ones before it (the rules across options on well-formed values)."""
    values = {name: variables.get(name, o.default) for name, o in OPTIONS.items()}
    checks = (
        lambda: run_id_problem(variables.get("run_id", UNDEFINED)),
        lambda: dump_problem(variables.get("dump", False)),
        lambda: unknown_problem(variables),
        lambda: "; ".join(option_problems(values)),
        lambda: limit_problem(trainers, play_hosts),
        lambda: placement_problem(values, trainers, str(variables["shared_mount"])),
        lambda: "; ".join(hosts_problems(values, trainers, hostvars)),
        lambda: program_problem(str(values["train_program"]), str(values["train_code_dir"])),
        lambda: scheduler_problem(values, variables.get("slurm_enabled", False)),
    )
    for check in checks:
        found = check()
        if found:  # one line, even where a value has a line break in it
            return found.replace("\r", "\\r").replace("\n", "\\n")
    return ""
