"""One training job from start to summary: validate input, train, checkpoint, report."""

from __future__ import annotations

import math
import sys
import time
import traceback
from pathlib import Path

import torch
from torch import nn

from ddpfleet_agent.summary import write_trainer_summary
from trainer import checkpoint as ckpt
from trainer import distributed as dist_utils
from trainer import jpeg
from trainer.balance import attempt_batches, loss_scale, micro_batches, parse_weights
from trainer.config import (
    BadInputError,
    TrainConfig,
    check_output_dir,
    default_batch_size,
    parse_config,
)
from trainer.data import build_datasets, build_loader
from trainer.decode import decode_choice, loader_cores
from trainer.engine import Run, train_epochs
from trainer.inputs import SHOWN_PATHS, InputPipeline
from trainer.metrics import LOG, Heartbeat, MetricsLog, NonFiniteError, Throughput, setup_logging
from trainer.model import (
    build_model,
    build_optimizer,
    build_scheduler,
    grad_scaler,
    resolve_amp,
    scaled_lr,
    warmup_epochs,
    wrap_ddp,
)
from trainer.resume import (
    rebalanced_weights,
    restarted,
    resume_state,
    shrunk_world,
    start_records,
)
from trainer.stop import StopFlag
from trainer.tboard import EventLog

# 2 and 3 tell the run agents that a restart would fail the same way (failures.FINAL_EXITS)
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 1, 2, 3


def _prepare(cfg: TrainConfig, env: dist_utils.DistEnv, heartbeat: Heartbeat) -> tuple:
    """Validate everything that can be wrong with the input; write nothing but a probe
    (and, once the output directory proved writable, the heartbeat: the scan can be long)."""
    check_output_dir(cfg.output_dir)
    batch = default_batch_size(cfg.batch_size, env.device.type)
    full, kept = shrunk_world()  # the first attempt's global batch, split among fewer ranks
    weights = rebalanced_weights()  # or by the agents' new weights after a rebalance
    batches, most = attempt_batches(
        cfg.batch_weights, batch, env.world_size, full, kept, weights=weights
    )
    dist_utils.init_distributed(env, cfg.dist_timeout)  # rank 0 chooses the checkpoint for all
    state, plan = resume_state(cfg, env)
    heartbeat.start(Path(cfg.output_dir))  # already started under the agent
    heartbeat.progress(step=int(state["step"]) if state else 0, phase="scan")
    cfg.batch_size = batch
    try:
        cores = loader_cores(cfg.workers, env.local_world_size)
        requested, cfg.decode = cfg.decode, decode_choice(cfg.decode, env.device.type, cores)
    except ValueError as exc:
        raise BadInputError(str(exc)) from None
    train_ds, val_ds, num_classes = build_datasets(cfg, encoded=cfg.decode == "gpu")
    heartbeat.progress(phase="start")  # until training: DDP's first broadcast waits for all
    cfg.num_classes = num_classes
    amp_dtype = resolve_amp(cfg.amp, env.device)
    model = build_model(cfg.arch, num_classes)
    if state is not None:
        try:
            model.load_state_dict(state["model"])  # type: ignore[arg-type]
        except RuntimeError:
            raise BadInputError(
                f"checkpoint at step {state['step']} does not fit --arch {cfg.arch} "
                f"with {num_classes} classes"
            ) from None
    world_batch = sum(batches)
    if len(train_ds) < world_batch:  # type: ignore[arg-type]
        raise BadInputError(
            f"{len(train_ds)} training images: fewer than one global batch ({world_batch})"  # type: ignore[arg-type]
        )
    auto = requested == "auto" and env.device.type == "cuda"  # off CUDA it is always cpu
    decoding = "" if cfg.synthetic else _jpeg_decoding(cfg.decode, auto, cores)
    return state, plan, train_ds, val_ds, amp_dtype, model, (batches, most), decoding


def _train(
    cfg: TrainConfig, env: dist_utils.DistEnv, prepared: tuple, stop: StopFlag, heartbeat: Heartbeat
) -> dict:
    state, plan, train_ds, val_ds, amp_dtype, model, (batches, most), decoding = prepared
    global_batch = sum(batches)
    out = Path(cfg.output_dir)
    start_step = int(state["step"]) if state else 0
    pin = env.device.type == "cuda"
    if pin:
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
    train_loader = build_loader(
        train_ds, cfg, env.rank, env.world_size, pin=pin, train=True, batches=batches
    )
    val_loader = (
        None
        if val_ds is None
        else build_loader(val_ds, cfg, env.rank, env.world_size, pin=pin, train=False)
    )
    spe = len(train_loader)
    total = cfg.max_steps or cfg.epochs * spe
    epochs = math.ceil(total / spe)
    micros = [micro_batches(b, m) for b, m in zip(batches, most, strict=True)]
    heartbeat.set_total(total, batches[env.rank], micros[env.rank])
    model = model.to(env.device, memory_format=torch.channels_last if cfg.channels_last else None)
    wrapped = wrap_ddp(model, env.device, env.world_size, static=max(micros) == 1)
    if cfg.compile:
        wrapped = torch.compile(wrapped)
    optimizer = build_optimizer(model, cfg, scaled_lr(cfg.lr, global_batch))
    warmup = warmup_epochs(cfg.warmup_epochs, global_batch)
    scheduler = build_scheduler(optimizer, total, round(warmup * spe), cfg.lr_decay)
    scaler = grad_scaler(env.device, amp_dtype)
    run = Run(
        cfg,
        env,
        wrapped,
        model,
        optimizer,
        scheduler,
        scaler,
        nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
        amp_dtype,
        heartbeat,
        None,
        Throughput(cfg.throughput_warmup),
        stop,
        total,
        spe,
    )
    run.loss_scale = loss_scale(batches[env.rank], global_batch, env.world_size)
    run.micro, run.global_batch = micros[env.rank], global_batch
    run.inputs = InputPipeline(env.device, cfg.image_size, cfg.channels_last, cfg.max_bad_samples)
    start_batch = ckpt.restore_run(run, state) if state else 0
    heartbeat.progress(step=run.step, epoch=run.epoch)
    hosts = [str(h) for h in dist_utils.gather_objects(env, env.host)]
    if env.is_main:
        start_records(cfg, plan)
        resumed = start_step if state else None
        run.metrics = MetricsLog(out / "metrics.jsonl", resumed)
        run.events = EventLog(out / "tensorboard", resumed, hosts, batches)
    LOG.info("world %d, device %s, amp %s, %d steps", env.world_size, env.device, amp_dtype, total)
    if decoding:
        LOG.info("JPEG decoding: %s", decoding)
    stopped, accuracy, start_batch = train_epochs(
        run, train_loader, val_loader, start_batch, epochs, save=lambda b: ckpt.save_run(run, b)
    )
    ckpt.save_run(run, start_batch)
    if run.events is not None:
        run.events.close()
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    rates = dist_utils.gather_objects(env, run.meter.overall())
    digests = dist_utils.gather_objects(env, dist_utils.param_digest(model))
    bad = sorted({p for ps in dist_utils.gather_objects(env, run.inputs.bad_paths) for p in ps})
    known = [r for r in rates if r is not None]
    skipped = {"skipped_checkpoints": plan["skipped"]} if plan["skipped"] else {}
    return skipped | {
        "status": "stopped" if stopped else "completed",
        "steps": run.step,
        "epoch": run.epoch,
        "images_per_sec": round(sum(known), 2) if len(known) == len(rates) else None,
        "per_rank_images_per_sec": [None if r is None else round(r, 2) for r in rates],
        "final_loss": run.last_loss,
        "final_accuracy": accuracy,
        "resumed_from_step": start_step if state else None,
        "param_sha256_per_rank": digests,
        "global_batch": global_batch,
        "per_rank_batch": batches,
        "batch_weights": parse_weights(cfg.batch_weights),
        "amp": str(amp_dtype).removeprefix("torch.") if amp_dtype else "off",
        "device": env.device.type,
        "throughput_warmup_steps": cfg.throughput_warmup,
        "decode": cfg.decode,
        "jpeg_region_decoder": jpeg.REGION is not None,
        "warmup_epochs": round(warmup, 3),
        "bad_samples": len(bad),
        "bad_sample_paths": bad[:SHOWN_PATHS],
    }


def _jpeg_decoding(chosen: str, auto: bool, cores: int) -> str:
    if chosen == "gpu":
        text = "nvJPEG on the rank's GPU, batched"
    elif jpeg.REGION is None:
        text = f"whole files (no {jpeg.DEFAULT_PATH}: the crop's region only needs it)"
    else:
        text = f"the crop's region only, at a DCT scale where it allows ({jpeg.REGION.path})"
    if auto:
        text += f" (--decode auto: {chosen}, the loader workers have {cores} core(s) per rank)"
    return text


def run(argv: list[str] | None, stop: StopFlag) -> int:
    """Run the trainer; returns the process exit code (see docs/design.md)."""
    env = dist_utils.env_from_torchrun()
    heartbeat = Heartbeat(env.rank, env.local_rank, env.host)
    heartbeat.start()  # only under the agent (its own directory): watched from the first second
    try:
        return _run(argv, stop, env, heartbeat)
    finally:
        heartbeat.stop()  # the final record: phase "done"


def _run(argv: list[str] | None, stop: StopFlag, env: dist_utils.DistEnv, hb: Heartbeat) -> int:
    started = time.time()
    try:
        cfg = restarted(parse_config(argv))
        dist_utils.seed_everything(cfg.seed, env.rank)
        prepared: tuple | Exception = _prepare(cfg, env, hb)
    except BadInputError as exc:
        if env.local_rank == 0:
            sys.stderr.write(f"trainer: error: {exc}\n")
        dist_utils.teardown(env)  # joined already when a rank-0 refusal reached every rank
        return EXIT_BAD_INPUT
    except Exception as exc:  # not the input (e.g. joining the group failed): recorded below
        prepared = exc
    setup_logging(Path(cfg.output_dir), env.rank)
    summary: dict[str, object] = {"world_size": env.world_size}
    agreed = False  # a failure every rank raised at the same point: the group can be torn down
    try:
        if isinstance(prepared, Exception):
            raise prepared
        summary |= _train(cfg, env, prepared, stop, hb)
        code = 128 + stop.agreed if summary["status"] == "stopped" else EXIT_OK
    except NonFiniteError as exc:  # diverged, on every rank alike: no traceback, no checkpoint
        LOG.error("training failed: %s", exc)
        newest = ckpt.list_checkpoints(ckpt.checkpoint_dir(Path(cfg.output_dir)))[:1]
        summary |= {
            "status": "failed",
            "error": str(exc),
            "nonfinite_step": exc.step,
            "last_checkpoint": f"checkpoints/{newest[0][1].name}" if newest else None,
        }
        code = EXIT_DIVERGED
        agreed = True
    except Exception as exc:  # any training failure: record it, exit 1
        LOG.error("training failed: %s\n%s", exc, traceback.format_exc())
        summary |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        code = EXIT_FAILED
    summary["wall_time_sec"] = round(time.time() - started, 3)
    if env.is_main:
        written = write_trainer_summary(Path(cfg.output_dir), summary)
        LOG.info("summary (%s) %s", written.name, summary)
    if code != EXIT_FAILED or agreed:
        dist_utils.teardown(env)
    return code
