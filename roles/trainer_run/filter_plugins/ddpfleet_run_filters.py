"""Filters of the trainer_run role: option checks (from meta/argument_specs.yml), the
trainer's command line, peers and ulimits."""

from __future__ import annotations

import math

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


def bad_options(values: dict, specs: dict, minimums: dict) -> list[str]:
    """'train_x must be ...' for each value that breaks its argument spec (type, choices), its
    minimum, or is not a finite number."""
    problems = []
    for name, value in sorted(values.items()):
        spec, low = specs.get(name, {}), minimums.get(name)
        kind = spec.get("type")
        if kind in ("int", "float"):
            try:
                number = None if isinstance(value, bool) else float(value)
            except (TypeError, ValueError):
                number = None
            # nan, inf and 1e999 pass every comparison with a minimum (an inf timeout would
            # switch supervision off), and int() of them raises
            if number is not None and not math.isfinite(number):
                problems.append(f"{name} must be a finite number (got {value})")
                continue
            whole = kind == "float" or (number is not None and number == int(number))
            if number is None or not whole or (low is not None and number < float(low)):
                what = "a whole number" if kind == "int" else "a number"
                bound = f" >= {low}" if low is not None else ""
                problems.append(f"{name} must be {what}{bound} (got {value!r})")
        elif kind == "bool":
            try:
                _truthy(value)
            except AnsibleFilterError:
                problems.append(f"{name} must be true or false (got {value!r})")
        elif kind == "dict" and not isinstance(value, dict):
            problems.append(f"{name} must be a mapping (got {value!r})")
        elif kind == "list" and not (
            isinstance(value, list)
            and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value)
        ):
            problems.append(
                f"{name} must be a list of strings, e.g. ['--epochs', '3'] (got {value!r})"
            )
        elif "choices" in spec and value not in spec["choices"]:
            problems.append(f"{name} must be one of {', '.join(spec['choices'])} (got {value!r})")
    return problems


def peers(hosts: list[str], hostvars: object) -> list[dict]:
    """[{name, hostname, cluster_ip}] of each host (hostname: node_hostname or the name)."""
    out = []
    for name in hosts:
        hv = hostvars[name]  # type: ignore[index]
        if "cluster_ip" not in hv:
            raise AnsibleFilterError(f"host {name} has no cluster_ip")
        hostname = str(hv.get("node_hostname") or name)
        out.append({"name": name, "hostname": hostname, "cluster_ip": str(hv["cluster_ip"])})
    return out


def fabric(ib_devices: list, settings: dict, numa_binding: str = "", gpus: int = 0) -> dict:
    """The run container's fabric options: {devices, env, torchrun_args, problems}.

    With InfiniBand/RoCE devices (``/dev/infiniband/*``, found by preflight) and the host
    variable ``infiniband`` not false, each device goes into the container (rwm) and every
    inventory variable ``nccl_ib_<name>`` becomes ``NCCL_IB_<NAME>`` (``nccl_ib_hca:
    mlx5_0,mlx5_1`` -> ``NCCL_IB_HCA``; ``nccl_ib_gid_index: 3`` for RoCE v2). nccl_ib_*
    settings on a host without devices would do nothing: a problem, as is NUMA binding (torchrun
    binds each rank near its GPU) on a host that runs no GPUs."""
    use_ib = bool(ib_devices) and _truthy(settings.get("infiniband", True))
    ib_vars = {k: v for k, v in sorted(settings.items()) if k.startswith("nccl_ib_")}
    problems = []
    if ib_vars and not use_ib:
        why = "infiniband is false" if ib_devices else "there is no /dev/infiniband"
        problems.append(f"{', '.join(ib_vars)} set but {why}")
    if numa_binding and int(gpus) <= 0:
        problems.append(f"train_numa_binding={numa_binding} needs GPUs (binds ranks near theirs)")
    env = {}
    for name, value in ib_vars.items() if use_ib else ():
        if isinstance(value, (dict, list)) or value is None:
            raise AnsibleFilterError(f"{name} must be a scalar, got {value!r}")
        env[name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return {
        "devices": [f"{d}:{d}:rwm" for d in sorted(ib_devices)] if use_ib else [],
        "env": env,
        "torchrun_args": [f"--numa-binding={numa_binding}"] if numa_binding else [],
        "problems": problems,
    }


def ulimits(wanted: dict, granted: dict) -> list[str]:
    """docker_container ulimits ('name:soft:hard'): each wanted value (-1 = unlimited) capped
    to what the engine may grant (-1 = anything)."""
    out = []
    for name in sorted(wanted):
        want, cap = int(wanted[name]), int(granted.get(name, -1))
        value = want if cap == -1 else cap if want == -1 else min(want, cap)
        out.append(f"{name}:{value}:{value}")
    return out


class FilterModule:
    """ddpfleet trainer_run filters."""

    def filters(self) -> dict:
        return {
            "ddpfleet_trainer_args": trainer_args,
            "ddpfleet_bad_options": bad_options,
            "ddpfleet_peers": peers,
            "ddpfleet_ulimits": ulimits,
            "ddpfleet_fabric": fabric,
        }
