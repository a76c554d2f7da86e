"""Command-line options of the trainer and their validation (no torch import here)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
from typing import NoReturn

from trainer.options import OPTIONS, Option, as_bool, flag_options

CPU_BATCH, CUDA_BATCH = 32, 256  # --batch-size 0: per rank, by the rank's device


def default_batch_size(batch_size: int, device_type: str) -> int:
    """--batch-size, or for 0 the field's default for the device (256 per GPU, as in NVIDIA's
    and torchvision's ResNet-50 recipes; 32 per CPU rank)."""
    if batch_size > 0:
        return batch_size
    return CUDA_BATCH if device_type == "cuda" else CPU_BATCH


class BadInputError(Exception):
    """A user-facing input problem: reported as one line on stderr, exit code 2."""


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
# The trainer's own flags that no train_* option sets directly: the role works them out.
_TRAINER_ONLY = {"batch_weights": (str, ""), "output_dir": (str, "output")}


def _flag_type(option: Option) -> type:
    return _TYPES[option.flag_type or option.type]


# Resolved options (every flag of trainer/options.py's declaration plus the trainer's own);
# the checkpoint stores ``dataclasses.asdict`` of this.
TrainConfig = dataclasses.make_dataclass(
    "TrainConfig",
    [
        *((o.dest, _flag_type(o) | None, o.trainer_default) for o in flag_options()),
        *((name, kind, default) for name, (kind, default) in _TRAINER_ONLY.items()),
    ],
)


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``trainer: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_flag(group: argparse._ArgumentGroup, option: Option) -> None:
    """One trainer flag from its declaration: a bool is a switch (store_true when off by
    default, --x/--no-x when on), a number is parsed as the trainer's type."""
    text = (option.flag_help or option.help).replace("%", "%%")
    if option.type == "bool":
        action = argparse.BooleanOptionalAction if option.default else "store_true"
        group.add_argument(option.flag, action=action, default=option.default, help=text)
    elif option.choices:
        group.add_argument(
            option.flag, choices=option.choices, default=option.trainer_default, help=text
        )
    else:
        kind = _flag_type(option)
        group.add_argument(option.flag, type=kind, default=option.trainer_default, help=text)


def get_args_parser() -> argparse.ArgumentParser:
    """The trainer's flags: those of trainer/options.py (each train_* option with a flag, its
    help and default) and the two the role works out (--batch-weights, --output-dir)."""
    p = _OneLineParser(
        prog="trainer",
        description="Data-parallel image classifier training (ResNet-50 by default).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in flag_options():
        if option.section not in groups:
            groups[option.section] = p.add_argument_group(option.section.lower())
        _add_flag(groups[option.section], option)
    groups["Optimisation"].add_argument(
        "--batch-weights",
        default="",
        metavar="W0,W1,...",
        help="one positive weight per global rank: each rank's share of the global batch "
        "(--batch-size x world size, unchanged), for hosts of unequal speed; empty: equal",
    )
    groups["Checkpoints and fault tolerance"].add_argument(
        "--output-dir", default="output", help="where checkpoints, metrics and logs go"
    )
    return p


def _check_finite(cfg: TrainConfig) -> None:
    """nan and inf parse as floats and pass every comparison: refuse them for every flag."""
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            flag = "--" + field.name.replace("_", "-")
            raise BadInputError(f"{flag} must be a finite number (got {value})")


def validate(cfg: TrainConfig) -> None:
    """Raise BadInputError for options that cannot work; touches the file system read-only."""
    _check_finite(cfg)
    for option in flag_options():
        value = getattr(cfg, option.dest)
        if option.min is None or option.dest == "num_classes":
            continue
        if value < option.min:
            low = "not be negative" if option.min == 0 else f"be at least {option.min}"
            raise BadInputError(f"{option.flag} must {low}")
        if value > option.max:  # type: ignore[operator]
            raise BadInputError(f"{option.flag} must be at most {option.max}")
    if cfg.num_classes == 1 or not 0 <= cfg.num_classes <= OPTIONS["train_num_classes"].max:
        raise BadInputError("--num-classes must be at least 2 (or 0: from the data set)")
    if cfg.synthetic == bool(cfg.data_dir):
        raise BadInputError("give exactly one of --data-dir DIR or --synthetic")
    if cfg.synthetic and cfg.synthetic_size < 1:
        raise BadInputError("--synthetic-size must be at least 1")
    if cfg.data_dir:
        train = Path(cfg.data_dir) / "train"
        if not Path(cfg.data_dir).is_dir():
            raise BadInputError(f"--data-dir {cfg.data_dir}: no such directory")
        if not train.is_dir():
            raise BadInputError(f"--data-dir {cfg.data_dir}: no train/ directory")
    if cfg.resume not in ("auto", "never", "archive") and not Path(cfg.resume).is_file():
        raise BadInputError(f"--resume {cfg.resume}: no such file")


def check_output_dir(path: str) -> None:
    """Make sure the output directory exists and is writable, without touching its files."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"--output-dir {path}: cannot create ({exc.strerror})") from None
    if not out.is_dir() or not os.access(out, os.W_OK | os.X_OK):
        raise BadInputError(f"--output-dir {path}: not a writable directory")
    probe = out / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise BadInputError(f"--output-dir {path}: not writable ({exc.strerror})") from None


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse and validate; argparse itself exits 2 with one line for malformed options."""
    cfg = TrainConfig(**vars(get_args_parser().parse_args(argv)))
    validate(cfg)
    if cfg.synthetic and cfg.num_classes == 0:
        cfg.num_classes = 1000
    return cfg


# Flags that are switches: store_true (off by default: present or absent) or
# BooleanOptionalAction (on by default: --x or --no-x), as get_args_parser builds them.
_STORE_TRUE = frozenset(o.dest for o in flag_options() if o.type == "bool" and not o.default)
_BOOLEAN_OPTIONAL = frozenset(o.dest for o in flag_options() if o.type == "bool" and o.default)


def command_options(values: dict, derived: dict) -> dict:
    """The trainer's options ({dest: value}) from the train_* values: each option with a
    trainer flag (train_batch_size -> batch_size), then ``derived`` (what the role works out:
    data_dir, output_dir, batch_weights) over them."""
    return {o.dest: values[o.name] for o in flag_options()} | dict(derived)


def command_args(options: dict) -> list[str]:
    """{'batch_size': 8, 'synthetic': True, 'data_dir': ''} -> ['--batch-size', '8', '--synthetic'],
    the command line get_args_parser reads back. Empty strings and None are left out (the
    trainer's own default applies); ValueError for a value that is no scalar or no boolean."""
    args: list[str] = []
    for name in sorted(options):
        value, flag = options[name], "--" + name.replace("_", "-")
        if name in _STORE_TRUE:
            args += [flag] if as_bool(value) else []
        elif name in _BOOLEAN_OPTIONAL:
            args.append(flag if as_bool(value) else "--no-" + flag[2:])
        elif value is None or value == "":
            continue
        elif isinstance(value, (dict, list)):
            raise ValueError(f"train_{name} must be a scalar, got {type(value).__name__}")
        else:
            args += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return args
