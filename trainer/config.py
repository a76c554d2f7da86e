"""Command-line options of the trainer and their validation (no torch import here)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
from typing import NoReturn

CPU_BATCH, CUDA_BATCH = 32, 256  # --batch-size 0: per rank, by the rank's device


def default_batch_size(batch_size: int, device_type: str) -> int:
    """--batch-size, or for 0 the field's default for the device (256 per GPU, as in NVIDIA's
    and torchvision's ResNet-50 recipes; 32 per CPU rank)."""
    if batch_size > 0:
        return batch_size
    return CUDA_BATCH if device_type == "cuda" else CPU_BATCH


class BadInputError(Exception):
    """A user-facing input problem: reported as one line on stderr, exit code 2."""


@dataclasses.dataclass
class TrainConfig:
    """Resolved options; the checkpoint stores ``dataclasses.asdict`` of this."""

    data_dir: str | None = None
    synthetic: bool = False
    synthetic_size: int = 1024
    num_classes: int = 0
    image_size: int = 224
    arch: str = "resnet50"
    batch_size: int = 0
    batch_weights: str = ""
    epochs: int = 1
    max_steps: int = 0
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    warmup_epochs: float = 1.0
    lr_decay: str = "cosine"
    amp: str = "auto"
    channels_last: bool = True
    compile: bool = False
    workers: int = 4
    decode: str = "auto"
    max_bad_samples: int = 10
    seed: int = 0
    output_dir: str = "output"
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    resume: str = "auto"
    log_every: int = 10
    dist_timeout: float = 600.0
    throughput_warmup: int = 3


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``trainer: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def get_args_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = _OneLineParser(
        prog="trainer",
        description="Data-parallel image classifier training (ResNet-50 by default).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_argument_group("data")
    src.add_argument("--data-dir", help="ImageFolder root with train/ and optional val/")
    src.add_argument("--synthetic", action="store_true", help="generated tensors, no file I/O")
    src.add_argument(
        "--synthetic-size",
        type=int,
        default=d.synthetic_size,
        help="training samples per epoch with --synthetic",
    )
    src.add_argument(
        "--num-classes",
        type=int,
        default=d.num_classes,
        help="classes (0: from the data set, 1000 with --synthetic)",
    )
    src.add_argument("--image-size", type=int, default=d.image_size)
    src.add_argument("--workers", type=int, default=d.workers, help="loader processes per rank")
    src.add_argument(
        "--decode",
        choices=["auto", "cpu", "gpu"],
        default=d.decode,
        help="JPEG decoding: gpu (nvJPEG, batched, on the rank's GPU), cpu (loader workers); "
        "auto: gpu on CUDA",
    )
    src.add_argument(
        "--max-bad-samples",
        type=int,
        default=d.max_bad_samples,
        help="unreadable images skipped (logged, counted in summary.json) before the run fails",
    )
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--arch", default=d.arch, help="torchvision model name")
    opt.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        help=f"per rank (0: {CUDA_BATCH} on CUDA, {CPU_BATCH} on the CPU)",
    )
    opt.add_argument(
        "--batch-weights",
        default=d.batch_weights,
        metavar="W0,W1,...",
        help="one positive weight per global rank: each rank's share of the global batch "
        "(--batch-size x world size, unchanged), for hosts of unequal speed; empty: equal",
    )
    opt.add_argument("--epochs", type=int, default=d.epochs)
    opt.add_argument(
        "--max-steps",
        type=int,
        default=d.max_steps,
        help="stop after this many optimizer steps (0: run all epochs)",
    )
    opt.add_argument(
        "--lr", type=float, default=d.lr, help="base LR for a global batch of 256, scaled linearly"
    )
    opt.add_argument("--momentum", type=float, default=d.momentum)
    opt.add_argument(
        "--weight-decay",
        type=float,
        default=d.weight_decay,
        help="not applied to BatchNorm weights and biases",
    )
    opt.add_argument("--label-smoothing", type=float, default=d.label_smoothing)
    opt.add_argument(
        "--warmup-epochs",
        type=float,
        default=d.warmup_epochs,
        help="linear LR warmup (capped at a quarter of the run)",
    )
    opt.add_argument(
        "--lr-decay",
        choices=["cosine", "step"],
        default=d.lr_decay,
        help="after warmup: cosine to 0, or x0.1 at 30/60/80%% of the run",
    )
    opt.add_argument("--seed", type=int, default=d.seed)
    spd = p.add_argument_group("speed")
    spd.add_argument("--amp", choices=["auto", "bf16", "fp16", "off"], default=d.amp)
    spd.add_argument(
        "--channels-last", action=argparse.BooleanOptionalAction, default=d.channels_last
    )
    spd.add_argument("--compile", action="store_true", help="torch.compile the model")
    spd.add_argument(
        "--throughput-warmup",
        type=int,
        default=d.throughput_warmup,
        help="first steps left out of the summary's images_per_sec",
    )
    out = p.add_argument_group("output and fault tolerance")
    out.add_argument("--output-dir", default=d.output_dir)
    out.add_argument(
        "--checkpoint-every",
        type=int,
        default=d.checkpoint_every,
        help="steps between checkpoints (0: only at the end and on stop)",
    )
    out.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    out.add_argument(
        "--resume",
        default=d.resume,
        metavar="{auto,never,archive,PATH}",
        help="auto: the newest readable checkpoint in --output-dir; never: start over (refused "
        "when --output-dir has checkpoints); archive: move its checkpoints, metrics and "
        "summary to archive/<time>/ and start over; or a checkpoint file",
    )
    out.add_argument("--log-every", type=int, default=d.log_every, help="steps per metrics row")
    out.add_argument(
        "--dist-timeout",
        type=float,
        default=d.dist_timeout,
        help="process-group timeout in seconds",
    )
    return p


_POSITIVE = ("image_size", "epochs", "log_every", "keep_checkpoints")
_NON_NEGATIVE = ("max_steps", "checkpoint_every", "workers", "throughput_warmup", "batch_size")
_NON_NEGATIVE += ("max_bad_samples",)


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
    for name in _POSITIVE:
        if getattr(cfg, name) < 1:
            raise BadInputError(f"--{name.replace('_', '-')} must be at least 1")
    for name in _NON_NEGATIVE:
        if getattr(cfg, name) < 0:
            raise BadInputError(f"--{name.replace('_', '-')} must not be negative")
    if cfg.lr <= 0 or cfg.dist_timeout <= 0:
        raise BadInputError("--lr and --dist-timeout must be positive")
    if cfg.num_classes == 1 or cfg.num_classes < 0:
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
