"""Filters of the trainer_run role: train_* options to the trainer's command line, and checks."""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

# Trainer flags that are switches: store_true (present or absent) or BooleanOptionalAction.
STORE_TRUE = frozenset({"synthetic", "compile"})
BOOLEAN_OPTIONAL = frozenset({"channels_last"})


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _truthy(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0", ""):
        return False
    if isinstance(value, (int, float)):
        return bool(value)
    raise AnsibleFilterError(f"not a boolean: {value!r}")


def trainer_args(options: dict) -> list[str]:
    """{'batch_size': 8, 'synthetic': True, 'data_dir': ''} -> ['--batch-size', '8', '--synthetic'].

    Empty strings and None are left out (the trainer's own default applies).
    """
    args: list[str] = []
    for name in sorted(options):
        value = options[name]
        if name in STORE_TRUE:
            if _truthy(value):
                args.append(_flag(name))
        elif name in BOOLEAN_OPTIONAL:
            args.append(_flag(name) if _truthy(value) else "--no-" + _flag(name)[2:])
        elif value is None or value == "":
            continue
        elif isinstance(value, (dict, list)):
            raise AnsibleFilterError(f"train_{name} must be a scalar, got {type(value).__name__}")
        else:
            args.append(_flag(name))
            args.append(str(value).lower() if isinstance(value, bool) else str(value))
    return args


def unknown_options(names: list[str], known: list[str]) -> list[str]:
    """train_* variable names that are not documented options, sorted."""
    return sorted(set(names) - set(known))


def bad_numbers(options: dict, minimums: dict) -> list[str]:
    """'train_x must be ...' for every option in minimums that is not a number >= its minimum."""
    problems = []
    for name, minimum in sorted(minimums.items()):
        value = options.get(name)
        try:
            number = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None or number < float(minimum):
            problems.append(f"{name} must be a number >= {minimum} (got {value!r})")
    return problems


def bad_bools(options: dict) -> list[str]:
    """'train_x must be true or false' for every option that is not a boolean (or its spelling)."""
    problems = []
    for name, value in sorted(options.items()):
        try:
            _truthy(value)
        except AnsibleFilterError:
            problems.append(f"{name} must be true or false (got {value!r})")
    return problems


def peers(hosts: list[str], hostvars: object) -> list[dict]:
    """[{name, hostname, cluster_ip}] of each host (hostname: node_hostname or the name)."""
    out = []
    for name in hosts:
        hv = hostvars[name]  # type: ignore[index]
        if "cluster_ip" not in hv:
            raise AnsibleFilterError(f"host {name} has no cluster_ip")
        out.append(
            {
                "name": name,
                "hostname": str(hv.get("node_hostname") or name),
                "cluster_ip": str(hv["cluster_ip"]),
            }
        )
    return out


def ulimits(wanted: dict, granted: dict) -> list[str]:
    """docker_container ulimits ('name:soft:hard'): each wanted value (-1 = unlimited) capped
    to what the engine may grant (-1 = anything)."""
    out = []
    for name in sorted(wanted):
        want = int(wanted[name])
        cap = int(granted.get(name, -1))
        if cap == -1:
            value = want
        elif want == -1:
            value = cap
        else:
            value = min(want, cap)
        out.append(f"{name}:{value}:{value}")
    return out


def outcomes(hosts: list[str], hostvars: object, key: str = "__trainer_run_supervise") -> dict:
    """{host: completed|stopped|peer_failed|failed} from each host's supervise result.

    A result without an outcome (the module itself crashed, or never ran) counts as failed.
    """
    out = {}
    for host in hosts:
        result = hostvars[host].get(key) or {}  # type: ignore[index]
        outcome = result.get("outcome") if isinstance(result, dict) else None
        out[host] = str(outcome) if outcome else "failed"
    return out


def status_lines(hosts: list[str], hostvars: object, run_id: str, rank0: str) -> list[str]:
    """status.yml's report from each host's registered ddpfleet_run_state result."""
    states = {h: dict(hostvars[h].get("__trainer_run_state") or {}) for h in hosts}  # type: ignore[index]
    summary = states.get(rank0, {}).get("summary") or {}
    running = any(st.get("running") for st in states.values())
    overall = "running" if running else summary.get("status", "unknown")
    lines = [f"run {run_id}: {overall}"]
    for host in hosts:
        st = states[host]
        containers = st.get("containers") or []
        if containers:
            parts = []
            for c in containers:
                code = "" if c.get("exit_code") is None else f" (exit code {c['exit_code']})"
                parts.append(f"{c.get('state')}{code}")
            ctext = ", ".join(parts)
        else:
            ctext = "absent"
        exit_txt = ""
        if st.get("exit"):
            try:
                exit_txt = f"; launcher exit code {json.loads(st['exit']).get('exit_code')}"
            except ValueError:
                exit_txt = f"; launcher exit {st['exit']}"
        lines.append(f"{host}: container {ctext}{exit_txt}")
        for hb in st.get("heartbeats") or []:
            age = hb.get("age_sec")
            lines.append(f"  rank {hb.get('rank')}: step {hb.get('step')}, heartbeat {age} s ago")
    if summary:
        lines.append(
            "summary: status {status}, steps {steps}, world size {ws}, img/s {ips}".format(
                status=summary.get("status", "?"),
                steps=summary.get("steps", "?"),
                ws=summary.get("world_size", "?"),
                ips=summary.get("images_per_sec", "?"),
            )
        )
        if summary.get("cause"):
            lines.append(f"cause: {summary['cause']}")
    last = states.get(rank0, {}).get("last_metrics") or {}
    if last:
        lines.append("last metrics: " + ", ".join(f"{k} {last[k]}" for k in sorted(last)))
    return lines


class FilterModule:
    """ddpfleet trainer_run filters."""

    def filters(self) -> dict:
        return {
            "ddpfleet_trainer_args": trainer_args,
            "ddpfleet_unknown_options": unknown_options,
            "ddpfleet_bad_numbers": bad_numbers,
            "ddpfleet_bad_bools": bad_bools,
            "ddpfleet_peers": peers,
            "ddpfleet_status_lines": status_lines,
            "ddpfleet_outcomes": outcomes,
            "ddpfleet_ulimits": ulimits,
        }
