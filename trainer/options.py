# ruff: noqa: E501 - one option per line: the declaration reads as a table
"""Every ``train_*`` option of ddpfleet, declared once: name, type, default, range, choices,
help and the trainer flag or run agent flag it maps to. Standard library only (no torch): the
trainer_run role's plugins import it on the controller, the trainer's argparse reads it in the
image (the image installs this package), and tools/gen_options.py writes the role's
argument_specs and defaults, the sample inventory and the run agent's flag table
(ddpfleet_agent/options.py: the agent is shipped alone into a user's image, without this
package) from it (``make generate``; ``make lint`` fails when they are stale).

A value from Ansible may be a string (``-e train_lr=0.05``); :func:`problem` says in one line
naming the option why a value does not fit its declaration, or returns ''.
"""

from __future__ import annotations

import dataclasses
import math

HOUR, DAY = 3600, 86_400
WEEK = 7 * DAY
PORT = 65_535


class _RoleDefault:
    """An Option's flag_default when the trainer's default is the role's."""


ROLE_DEFAULT = _RoleDefault()


@dataclasses.dataclass(frozen=True)
class Option:
    """One option. Numbers have both bounds; ``flag`` is ``python -m trainer``'s flag, if any,
    with its own default, type or help where the trainer's differ from the role's;
    ``agent_flag`` is ``python -m ddpfleet_agent``'s, with the role's default, type, help and
    range, but for ``agent_min`` where the agent takes shorter times than a user may set (its
    tests run real agents with timeouts of a second or two)."""

    name: str
    type: str  # int, float, str, bool, dict, list (of strings) or raw
    default: object
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    flag: str = ""
    flag_default: object = ROLE_DEFAULT
    flag_type: str = ""  # '': the option's type
    flag_help: str = ""  # '': the option's help
    agent_flag: str = ""
    agent_min: float | None = None  # None: the option's min
    section: str = ""

    @property
    def dest(self) -> str:
        """The trainer's argparse dest (``--batch-size`` -> ``batch_size``)."""
        return self.flag[2:].replace("-", "_")

    @property
    def trainer_default(self) -> object:
        return self.default if self.flag_default is ROLE_DEFAULT else self.flag_default

    @property
    def agent_dest(self) -> str:
        """The run agent's argparse dest and AgentConfig field (``--peer-timeout`` ->
        ``peer_timeout``)."""
        return self.agent_flag[2:].replace("-", "_")


def _section(title: str, *options: Option) -> list[Option]:
    return [dataclasses.replace(o, section=title) for o in options]


_ULIMITS = (
    "Locked-memory limit of the ranks in bytes (-1: unlimited, what NCCL/RDMA want) and their "
    "stack size. Capped to what the Docker engine may grant (one without CAP_SYS_RESOURCE, e.g. "
    "nested in the sandbox, cannot raise its own hard limits)."
)
RUN_ID_HELP = (
    'The run handle: 1-64 letters, digits, "-", "_" or ".", starting with a letter or digit; '
    "names containers, labels, the rendezvous id and <shared_mount>/runs/<run_id>/. Required; "
    "checked by the validate tasks (one-line error) that the playbooks run first."
)
DUMP_HELP = (
    "Take a forensics bundle of the live run first (status.yml: and leave it running): every "
    "rank's stacks, each host's state and a diagnosis line, in "
    "<shared_mount>/runs/<run_id>/forensics/live-<time>/."
)

# fmt: off
OPTIONS: dict[str, Option] = {o.name: o for o in [
    *_section(
        "Data",
        Option("train_data_dir", "str", "", "ImageFolder root (train/ and optional val/): relative to <shared_mount>/datasets or absolute inside it (the run containers see only datasets/, read-only, and their own run directory). Leave empty with train_synthetic: true.",
               flag="--data-dir", flag_default=None, flag_help="ImageFolder root with train/ and optional val/"),
        Option("train_synthetic", "bool", False, "Generated tensors instead of files (no I/O; for smoke tests and benchmarks).", flag="--synthetic"),
        Option("train_synthetic_size", "int", 1024, "Training samples per epoch with synthetic data.", 1, 100_000_000, flag="--synthetic-size"),
        Option("train_num_classes", "int", 0, "Classes (0: from the data set; 1000 with synthetic data).", 0, 1_000_000, flag="--num-classes"),
        Option("train_image_size", "int", 224, "Input resolution in pixels.", 1, 8192, flag="--image-size"),
        Option("train_workers", "int", 4, "DataLoader processes per rank.", 0, 256, flag="--workers"),
        Option("train_decode", "str", "auto", "JPEG decoding: gpu (nvJPEG on the rank's GPU, batched; the loader workers only read files), cpu (PIL/libjpeg-turbo in the loader workers), auto: cpu off CUDA; on CUDA cpu where the workers have 6 or more cores per rank, else gpu (the rank log says which and why).",
               choices=("auto", "cpu", "gpu"), flag="--decode"),
        Option("train_max_bad_samples", "int", 10, "Unreadable images (truncated, corrupt) skipped, logged and counted in summary.json; more than this fails the run, naming them.", 0, 1_000_000_000, flag="--max-bad-samples"),
    ),
    *_section(
        "Optimisation",
        Option("train_arch", "str", "resnet50", "torchvision model name.", flag="--arch"),
        Option("train_batch_size", "int", 0, "Images per rank per step (0: 256 on a GPU, 32 on a CPU; global batch = this x world size).", 0, 65_536, flag="--batch-size"),
        Option("train_epochs", "int", 1, "Passes over the data.", 1, 100_000, flag="--epochs"),
        Option("train_max_steps", "int", 0, "Stop after this many optimizer steps (0: run all epochs).", 0, 1_000_000_000, flag="--max-steps"),
        Option("train_lr", "float", 0.1, "Base learning rate for a global batch of 256 (scaled linearly by the trainer).", 1e-7, 1e30, flag="--lr"),  # 1e30: what the divergence tests use
        Option("train_momentum", "float", 0.9, "SGD momentum.", 0.0, 1.0, flag="--momentum"),
        Option("train_weight_decay", "float", 0.0001, "Weight decay (not applied to BatchNorm parameters and biases).", 0.0, 1.0, flag="--weight-decay"),
        Option("train_label_smoothing", "float", 0.1, "Label smoothing of the cross-entropy loss.", 0.0, 1.0, flag="--label-smoothing"),
        Option("train_warmup_epochs", "float", 1.0, "Linear LR warmup in epochs, at least; it grows with the global batch to 5 epochs per 8,192 images (Goyal et al.), capped at a quarter of the run.", 0.0, 100_000.0, flag="--warmup-epochs"),
        Option("train_lr_decay", "str", "cosine", "After warmup: cosine or step decay.", choices=("cosine", "step"), flag="--lr-decay"),
        Option("train_seed", "int", 0, "Seed (each rank derives its own from it).", 0, 2**32 - 1, flag="--seed"),
    ),
    *_section(
        "Speed",
        Option("train_amp", "str", "auto", "Mixed precision: auto (bf16 where supported), bf16, fp16 or off.", choices=("auto", "bf16", "fp16", "off"), flag="--amp"),
        Option("train_channels_last", "bool", True, "channels_last memory format (faster convolutions on tensor cores and AVX-512).", flag="--channels-last"),
        Option("train_compile", "bool", False, "torch.compile the model (slower start, faster steps).", flag="--compile"),
        Option("train_throughput_warmup", "int", 3, "First steps left out of the summary's images_per_sec.", 0, 1_000_000, flag="--throughput-warmup"),
    ),
    *_section(
        "Checkpoints and fault tolerance",
        Option("train_checkpoint_every", "int", 500, "Steps between checkpoints: a failed run resumes from the newest one (0: only at the end/stop).", 0, 1_000_000_000,
               flag="--checkpoint-every", flag_default=0),
        Option("train_keep_checkpoints", "int", 2, "Checkpoints kept in the run directory.", 1, 1000, flag="--keep-checkpoints"),
        Option("train_resume", "str", "auto", "auto: resume from the newest readable checkpoint of the run (what re-running train.yml relies on); never: start over (refused when the run has checkpoints); archive: move its checkpoints, metrics and summary to archive/<time>/ and start over; or a checkpoint path.",
               flag="--resume"),
        Option("train_log_every", "int", 10, "Steps per metrics.jsonl row and log line.", 1, 1_000_000, flag="--log-every"),
        Option("train_dist_timeout", "int", 600, "Process-group (collective) timeout in seconds: how long a rank waits for a dead peer.", 1, WEEK,
               flag="--dist-timeout", flag_default=600.0, flag_type="float"),
    ),
    *_section(
        "Launch",
        Option("train_nproc_per_node", "int", 0, "Processes per host (0: the host's `gpus`, or 1 without GPUs). Must be equal on every host.", 0, 1024),
        Option("train_master_host", "str", "", "inventory_hostname of node rank 0 (empty: the first host of `trainers`)."),
        Option("train_master_port", "int", 29500, "torchrun's static-rendezvous port on rank 0's cluster_ip; must be free.", 1, PORT),
        Option("train_image", "str", "", "Image reference (empty: /etc/ddpfleet/trainer_image, written by site.yml on every trainer)."),
        Option("train_numa_binding", "str", "", "torchrun --numa-binding: bind each rank to the CPUs near its GPU (node, socket, exclusive, core-complex); empty: no binding.",
               choices=("", "node", "socket", "exclusive", "core-complex")),
        Option("train_omp_num_threads", "int", 0, "OMP_NUM_THREADS per rank (0: torchrun's default of 1 when several ranks share a host).", 0, 1024),
        Option("train_ipc_host", "bool", False, "Share the host's IPC namespace and /dev/shm (true), or give the container its own /dev/shm."),
        Option("train_shm_size_mb", "int", 8192, "/dev/shm the ranks need in MiB (DataLoader workers pass batches through it); checked by preflight against the host's /dev/shm (ipc_host) or memory (private shm of this size).", 1, 2**20),
        Option("train_ulimit_memlock", "int", -1, _ULIMITS, -1, 2**50),
        Option("train_ulimit_stack", "int", 67108864, _ULIMITS, -1, 2**40),
        Option("train_env", "dict", {}, "Extra environment for the ranks, e.g. {NCCL_DEBUG: INFO}."),
    ),
    *_section(
        "Unequal hosts",
        Option("train_balance", "raw", "off", "Unequal hosts: off (every rank the same batch), auto (each host's share of the global batch proportional to its measured img/s: the newest doctor.yml result for this arch, image size, batch and amp, else a short calibration before the launch), or a mapping of every trainer to a weight, e.g. {node1: 3, node2: 3, node3: 1}. The global batch, learning rate and gradient stay those of an equal split. ddpfleet's trainer only."),
        Option("train_cpus", "float", 0.0, "Docker CPU quota of this host's run and doctor containers (e.g. 0.5; 0: no limit); set it per host in the inventory to keep cores free for other work, or to make a host slower on purpose.", 0.0, 4096.0),
        Option("train_doctor", "bool", False, "Run doctor.yml's checks (compute, network, storage) on every trainer before the launch and store them under <shared_mount>/doctor/ (train_balance=auto then uses them)."),
    ),
    *_section(
        "Your own program instead of ddpfleet's trainer",
        Option("train_program", "str", "", "Your own DDP program instead of ddpfleet's trainer: a Python module (pkg.train, run as torchrun ... -m pkg.train) or a script path ending in .py, in train_code_dir or in the image. The trainer's options (data, optimisation, speed, checkpoints) then do not apply.",
               agent_flag="--program"),
        Option("train_program_args", "list", [], "Arguments after the program, e.g. ['--epochs', '3'] (a list of strings)."),
        Option("train_code_dir", "str", "", "A directory on the controller with the program's code, copied to runs/<run_id>/code/ when the run starts (a resumed run uses that frozen copy); the ranks start there, with it on PYTHONPATH. Empty: the code is in the image."),
    ),
    *_section(
        "Supervision (the run agents) and following",
        Option("train_heartbeat_timeout", "int", 300, "Seconds a rank may go frozen (its heartbeat thread silent) or, in training or validation, without progress before the agents fail the run; data-set scans, validation and checkpoint saves keep beating.", 5, WEEK,
               agent_flag="--heartbeat-timeout", agent_min=1),
        Option("train_restarts", "int", 2, "Restarts, with no controller: after a rank's failure on a host that is still there (a crash, a killed or frozen rank), the agents restart every rank in place from the newest checkpoint; after a host is gone, without it (train_min_hosts); at most this many times in the run, and not after bad input, a non-finite loss, or the same rank failing again at the same step. 0: the first failure ends the run.", 0, 1000, agent_flag="--restarts"),
        Option("train_min_hosts", "int", 0, "Shrink instead of failing: a host gone (silent past train_peer_timeout: cut off, its container killed) is left out and the others restart from the newest checkpoint while at least this many remain, with the same global batch (split again, by the balance weights when train_balance is on; gradient accumulation where a rank's share outgrows its first one). Node rank 0's host may be lost too (the lowest-ranked host left serves the agents' store and torchrun's from then on). Needs train_restarts. 0: every trainer (no shrinking).", 0, 100_000, agent_flag="--min-hosts"),
        Option("train_rebalance", "str", "auto", "Stragglers: auto (node rank 0's agent watches each host's own time per image, its data wait and forward pass; when a host's step, by the median of its last 5 log intervals, is at least 1.3x the balanced one twice in a row, at most 4 times an hour, the ranks restart at the next checkpoint with shares proportional to the hosts' speeds, and give a share back once the host is fast again; a host under 0.25x is left out instead where train_min_hosts allows, and taken back once doctor's compute check in place is twice as fast as when it was left out, or a third as fast as the median host was then: same global batch, not counted in train_restarts) or off. ddpfleet's trainer only, with checkpoints.", choices=("auto", "off"), agent_flag="--rebalance"),
        Option("train_peer_timeout", "int", 60, "Seconds without a peer agent's keepalive before that host counts as failed (at least 5).", 5, WEEK,
               agent_flag="--peer-timeout", agent_min=1),
        Option("train_agent_port", "int", 0, "Port of the agents' store on rank 0's cluster_ip (0: train_master_port + 1); must be free there and reachable from every host.", 0, PORT),
        Option("train_metrics_port", "int", 0, "Port of each host's run agent's Prometheus endpoint (/metrics on its cluster_ip: steps, img/s, loss, heartbeat ages, GPUs) while the run goes (0: train_master_port + 2); must be free on every host.", 0, PORT),
        Option("train_follow", "bool", True, "Follow the run until it ends and report it (false: train.yml returns right after the launch; follow the run with status.yml)."),
        Option("train_poll_interval", "int", 5, "Seconds between train.yml's reads of the run directory while it follows a run (one progress line when the step changed). Each read waits on node rank 0's host for the run's end, up to this long (30 s at most), so that at intervals up to 30 s train.yml sees the end within a second.", 1, HOUR),
        Option("train_max_runtime", "int", 604800, "The agents fail the run if it is still going after this many seconds (default: 7 days).", 60, 366 * DAY, agent_flag="--max-runtime"),
        Option("train_stop_timeout", "int", 90, "Grace period of a stop: the agents SIGTERM their ranks and SIGKILL them after this many seconds; stop.yml waits this plus 30 s for every container to be gone. Keep it above one log interval plus the longest checkpoint save.", 1, DAY, agent_flag="--stop-timeout"),
        Option("train_preflight_timeout", "int", 20, "Seconds preflight waits for every host to reach the rendezvous and agent ports.", 1, HOUR),
        Option("train_log_tail_lines", "int", 20, "Lines of the failing rank's log kept in summary.json's failure.", 0, 100_000, agent_flag="--log-tail-lines"),
        Option("train_straggler_ratio", "float", 0.9, "A rank below this fraction of the median img/s is flagged as a straggler in the report.", 0.0, 1.0, agent_flag="--straggler-ratio"),
    ),
    *_section(
        "Queueing runs through Slurm",
        Option("train_scheduler", "str", "direct", "direct: train.yml starts the run's containers itself, on hosts that must be free. slurm: one sbatch job allocates every trainer exclusively and starts the same containers, with the same agent, once Slurm grants the hosts; a run waits in the queue while another holds them. Needs the Slurm cluster site.yml makes (slurm_enabled: true).", choices=("direct", "slurm")),
        Option("train_partition", "str", "", "The Slurm partition of the run's job (train_scheduler=slurm); it must hold every trainer. Empty: slurm_partition, the one site.yml makes."),
        Option("train_time_limit", "int", 0, "The Slurm job's time limit in minutes (train_scheduler=slurm; 0: the partition's). At the limit Slurm stops the run as stop.yml does (the ranks checkpoint) and no run container is left; train.yml resumes it.", 0, 366 * DAY // 60),
    ),
]}
# fmt: on

TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0", "")


def as_bool(value: object) -> bool:
    """A boolean as Ansible writes it (true, "yes", 1, "off", ...); ValueError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    if isinstance(value, (int, float)):
        return bool(value)
    raise ValueError(f"not a boolean: {value!r}")


def as_float(value: object) -> float | None:
    """float(value), or None for bools and what is no number (inf and nan are numbers here)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None


def finite(value: object) -> float | None:
    """A finite float, or None (bools, strings that are no number, nan, inf)."""
    number = as_float(value)
    return number if number is not None and math.isfinite(number) else None


def bounds(option: Option) -> str:
    """'from 1 to 65535' (ints as ints, floats as Python writes them)."""
    show = int if option.type == "int" else float
    return f"from {show(option.min)} to {show(option.max)}"  # type: ignore[arg-type]


def _number_problem(opt: Option, value: object) -> str:
    number = as_float(value)
    if number is not None and not math.isfinite(number):
        return f"{opt.name} must be a finite number (got {' '.join(str(value).split())})"
    whole = opt.type == "float" or (number is not None and number.is_integer())
    if number is None or not whole or not opt.min <= number <= opt.max:  # type: ignore[operator]
        what = "a whole number" if opt.type == "int" else "a number"
        return f"{opt.name} must be {what} {bounds(opt)} (got {value!r})"
    return ""


def _is_bool(value: object) -> bool:
    try:
        as_bool(value)
    except ValueError:
        return False
    return True


def _is_arg_list(value: object) -> bool:
    scalar = (str, int, float)
    return isinstance(value, list) and all(
        isinstance(v, scalar) and not isinstance(v, bool) for v in value
    )


def _str_problem(opt: Option, value: object) -> str:
    if opt.choices and value not in opt.choices:
        return f"{opt.name} must be one of {', '.join(opt.choices)} (got {value!r})"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return f"{opt.name} must be a string (got {value!r})"
    return ""


def problem(name: str, value: object) -> str:
    """Why ``value`` does not fit the declaration of option ``name``, in one line ('' if it
    does). nan, inf and 1e999 pass every comparison (an inf timeout would switch supervision
    off): they are refused by name."""
    opt = OPTIONS[name]
    if opt.type in ("int", "float"):
        return _number_problem(opt, value)
    if opt.type == "bool" and not _is_bool(value):
        return f"{name} must be true or false (got {value!r})"
    if opt.type == "dict" and not isinstance(value, dict):
        return f"{name} must be a mapping (got {value!r})"
    if opt.type == "list" and not _is_arg_list(value):
        return f"{name} must be a list of strings, e.g. ['--epochs', '3'] (got {value!r})"
    if opt.type == "str":
        return _str_problem(opt, value)
    return ""


def flag_options() -> list[Option]:
    """The options that map to a flag of ``python -m trainer``, in declaration order."""
    return [o for o in OPTIONS.values() if o.flag]


def agent_options() -> list[Option]:
    """The options that map to a flag of ``python -m ddpfleet_agent``, in declaration order."""
    return [o for o in OPTIONS.values() if o.agent_flag]


def agent_args(values: dict) -> list[str]:
    """The run agent's flags for the train_* ``values`` (each option with an agent flag; a
    value Ansible gave as a string, "60" or "60.0", as the agent's type reads it):
    ``['--peer-timeout=60', ..., '--program=']``, one word each (a value may start with -)."""
    args = []
    for opt in agent_options():
        value = values[opt.name]
        if opt.type == "int":
            value = int(float(value))
        elif opt.type == "float":
            value = float(value)
        args.append(f"{opt.agent_flag}={value}")
    return args
