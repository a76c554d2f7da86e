"""--batch-weights: the split of the global batch, the weighted sampler, the loss scaling
that keeps DDP's gradient the global-batch mean, and 2-rank runs of the real CLI."""

from __future__ import annotations

import re
import shutil
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fake_clock import Clock
from torch import nn
from trainer_helpers import TINY, free_port, read_json, run_trainer, tiny_mlp, tiny_samples

from trainer import balance, engine, metrics
from trainer.__main__ import main
from trainer.balance import (
    WeightedDistributedSampler,
    forward_backward,
    loss_scale,
    rank_batches,
    scaled_loss,
    split_batch,
)
from trainer.config import BadInputError, TrainConfig, parse_config
from trainer.data import EpochSampler, SyntheticImages, build_loader
from trainer.metrics import ForwardTimer
from trainer.model import wrap_ddp

# --- the split ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_batch", "weights", "shares"),
    [
        (8, [3, 1], [6, 2]),
        (10, [1, 1, 1], [4, 3, 3]),  # equal remainders: the lower rank first
        (10, [1, 2, 4], [1, 3, 6]),  # quotas 1.43, 2.86, 5.71: the two largest remainders
        (512, [1, 1], [256, 256]),
        (7, [0.5, 0.25, 0.25], [3, 2, 2]),  # 3.5, 1.75, 1.75: the largest remainders, not halves
    ],
)
def test_split_is_the_largest_remainder_split(global_batch, weights, shares) -> None:
    assert split_batch(global_batch, weights) == shares


@pytest.mark.parametrize("weights", [[3.0, 1.0], [1.7, 2.9, 0.4], [0.1, 1.0, 5.0, 2.5]])
@pytest.mark.parametrize("global_batch", [97, 256, 1000])
def test_split_sums_to_the_global_batch_and_is_proportional(global_batch, weights) -> None:
    shares = split_batch(global_batch, weights)
    assert sum(shares) == global_batch
    for share, w in zip(shares, weights, strict=True):
        assert abs(share - global_batch * w / sum(weights)) < 1
    assert split_batch(global_batch, weights) == shares  # deterministic


def test_no_weights_means_equal_batches() -> None:
    assert rank_batches("", 32, 3) == [32, 32, 32]
    assert rank_batches("3,1", 4, 2) == [6, 2]
    assert loss_scale(32, 96, 3) == 1.0  # exactly: scaled_loss then returns the loss itself


@pytest.mark.parametrize(
    ("text", "world", "message"),
    [
        ("3,x", 2, "--batch-weights 3,x: 'x' is not a number"),
        ("3,,1", 3, "--batch-weights 3,,1: '' is not a number"),
        ("3,0", 2, r"--batch-weights 3,0: weights must be positive \(got 0.0\)"),
        ("-1,1", 2, r"--batch-weights -1,1: weights must be positive \(got -1.0\)"),
        ("nan,1", 2, r"--batch-weights nan,1: weights must be finite \(got nan\)"),
        ("1,inf", 2, r"--batch-weights 1,inf: weights must be finite \(got inf\)"),
        ("3,1,1", 2, r"--batch-weights 3,1,1: 3 weight\(s\) for 2 rank\(s\); give one per"),
        (
            "100,1",
            2,
            "--batch-weights: rank 1's share of the global batch of 4 images rounds to 0",
        ),
    ],
)
def test_bad_weights_are_refused(text: str, world: int, message: str) -> None:
    with pytest.raises(BadInputError, match=f"^{message}"):
        rank_batches(text, 2, world)


def test_the_flag_is_parsed() -> None:
    assert parse_config(["--synthetic", "--batch-weights", "3,1"]).batch_weights == "3,1"
    assert parse_config(["--synthetic"]).batch_weights == ""


# --- the sampler ----------------------------------------------------------------------------

CASES = [(20, [5, 3], 0), (100, [6, 2], 3), (37, [1, 2, 4], 1), (64, [6, 1, 1], 2)]


def _samplers(n: int, batches: list[int], epoch: int) -> list[WeightedDistributedSampler]:
    samplers = [WeightedDistributedSampler(n, batches, r, seed=7) for r in range(len(batches))]
    for s in samplers:
        s.set_epoch(epoch)
    return samplers


@pytest.mark.parametrize(("n", "batches", "epoch"), CASES)
def test_ranks_share_each_global_batch_without_overlap(n, batches, epoch) -> None:
    samplers = _samplers(n, batches, epoch)
    size, steps = sum(batches), n // sum(batches)
    parts = [list(s) for s in samplers]
    assert {e for part in parts for e, _ in part} == {epoch}
    indices = [[i for _, i in part] for part in parts]
    for r, part in enumerate(indices):
        assert len(part) == len(samplers[r]) == steps * batches[r]
        for other in indices[r + 1 :]:
            assert not set(part) & set(other)
    perm = samplers[0].permutation()
    assert sorted(perm) == list(range(n))
    assert sorted(i for part in indices for i in part) == sorted(perm[: steps * size])
    assert n - steps * size < size  # only the remainder is dropped
    for s in range(steps):  # step s: the global slice, cut at the cumulative local batches
        chunks = [part[s * b : (s + 1) * b] for part, b in zip(indices, batches, strict=True)]
        assert [i for chunk in chunks for i in chunk] == perm[s * size : (s + 1) * size]


@pytest.mark.parametrize(("n", "batches", "epoch"), CASES)
def test_the_order_depends_on_the_epoch_only(n, batches, epoch) -> None:
    first, again = _samplers(n, batches, epoch), _samplers(n, batches, epoch)
    assert [list(s) for s in first] == [list(s) for s in again]
    later = _samplers(n, batches, epoch + 1)
    assert [i for _, i in later[0]] != [i for _, i in first[0]]


@pytest.mark.parametrize(("n", "batches", "epoch"), CASES)
@pytest.mark.parametrize("skip", [1, 2])
def test_resume_skips_whole_steps_of_the_local_batch(n, batches, epoch, skip) -> None:
    pairs = zip(_samplers(n, batches, epoch), _samplers(n, batches, epoch), strict=True)
    for full, resumed in pairs:
        resumed.set_start_batch(skip, batch_size=999)  # the runner's --batch-size: ignored
        assert list(resumed) == list(full)[skip * full.batch :]
        assert len(resumed) == len(full) - skip * full.batch


def test_the_training_loader_takes_the_rank_s_batch_and_equal_steps() -> None:
    cfg = TrainConfig(synthetic=True, num_classes=4, image_size=8, batch_size=4, workers=0)
    data = SyntheticImages(50, 4, 8, 0)
    loaders = [build_loader(data, cfg, r, 2, pin=False, train=True, batches=[6, 2]) for r in (0, 1)]
    assert [len(loader) for loader in loaders] == [6, 6]  # 50 // 8 steps on both ranks
    assert [len(next(iter(loader))[1]) for loader in loaders] == [6, 2]
    assert isinstance(loaders[0].sampler, WeightedDistributedSampler)


def test_equal_shares_take_the_same_sampler() -> None:
    """Equal shares too: step s takes the same images at any world size (test_trainer_shrink)."""
    cfg = TrainConfig(synthetic=True, num_classes=4, image_size=8, batch_size=4, workers=0)
    data = SyntheticImages(50, 4, 8, 0)
    loader = build_loader(data, cfg, 1, 2, pin=False, train=True)
    assert isinstance(loader.sampler, WeightedDistributedSampler)
    assert loader.batch_size == 4
    assert isinstance(build_loader(data, cfg, 1, 2, pin=False, train=False).sampler, EpochSampler)


# --- the gradient ---------------------------------------------------------------------------

LOCAL = [5, 3]


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _rank(rank: int, port: int, out: str) -> None:
    """One gloo rank: the trainer's DDP wrapper and loss scaling over its LOCAL[rank] samples,
    once with the scale and once without; saves the gradients and the scaled loss."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = wrap_ddp(tiny_mlp(), torch.device("cpu"), 2)
    x, y = tiny_samples(sum(LOCAL))
    lo = sum(LOCAL[:rank])
    x, y = x[lo : lo + LOCAL[rank]], y[lo : lo + LOCAL[rank]]
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    result = {}
    for name, scale in (("scaled", loss_scale(LOCAL[rank], sum(LOCAL), 2)), ("plain", 1.0)):
        model.zero_grad(set_to_none=True)
        loss = scaled_loss(criterion(model(x), y), scale)
        loss.backward()
        result[name] = _grads(model)
        result[f"{name}_loss"] = loss.detach()
    torch.save(result, Path(out) / f"rank-{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_grads(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("ddp_grads")
    mp.spawn(_rank, args=(free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank-{r}.pt", weights_only=True) for r in (0, 1)]


def _reference() -> tuple[list[torch.Tensor], torch.Tensor]:
    """One process, the mean loss over the concatenated 8 samples."""
    model = tiny_mlp()
    x, y = tiny_samples(sum(LOCAL))
    loss = nn.CrossEntropyLoss(label_smoothing=0.1)(model(x), y)
    loss.backward()
    return _grads(model), loss.detach()


def test_the_engine_scales_with_the_tested_function() -> None:
    assert engine.forward_backward is balance.forward_backward


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward takes ``clock``'s second (as a wait for peers would)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, clock: Clock) -> torch.Tensor:
        ctx.clock = clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.sleep(1.0)
        return grad, None


class _Timed(nn.Module):
    """tiny_mlp whose forward takes 0.02 s of ``clock`` and whose backward 1 s."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock, self.inner = clock, tiny_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.sleep(0.02)
        return _SlowBackward.apply(self.inner(x), self.clock)


def test_forward_backward_times_the_forwards_and_not_the_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Model and criterion of every piece count; the backward (where DDP waits) does not."""
    clock = Clock()
    monkeypatch.setattr(metrics, "time", types.SimpleNamespace(perf_counter=clock.monotonic))
    criterion = nn.CrossEntropyLoss()

    def slow_criterion(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        clock.sleep(0.01)
        return criterion(out, y)

    run = types.SimpleNamespace(
        model=_Timed(clock), criterion=slow_criterion, env=types.SimpleNamespace(
            device=torch.device("cpu")), amp_dtype=None, loss_scale=1.0, micro=3,
        scaler=torch.amp.GradScaler("cpu", enabled=False), forward_time=ForwardTimer(),
    )  # fmt: skip
    forward_backward(run, *tiny_samples(6))
    assert clock.now == pytest.approx(1000 + 3 * (0.03 + 1.0))  # the backwards did take time
    assert run.forward_time.seconds() == pytest.approx(3 * 0.03)


@pytest.mark.slow
def test_scaled_ddp_gradient_is_the_global_batch_mean(ddp_grads: list[dict]) -> None:
    reference, _ = _reference()
    for grads in ddp_grads:  # DDP leaves the all-reduced mean on every rank
        for got, want in zip(grads["scaled"], reference, strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_without_the_scale_the_gradient_differs(ddp_grads: list[dict]) -> None:
    reference, _ = _reference()
    gaps = [
        (got - want).abs().max() for got, want in zip(ddp_grads[0]["plain"], reference, strict=True)
    ]
    assert max(gaps) > 1e-3


@pytest.mark.slow
def test_the_ranks_mean_scaled_loss_is_the_global_mean(ddp_grads: list[dict]) -> None:
    _, reference = _reference()
    logged = (ddp_grads[0]["scaled_loss"] + ddp_grads[1]["scaled_loss"]) / 2  # as _log_interval
    torch.testing.assert_close(logged, reference, atol=1e-12, rtol=0)
    plain = (ddp_grads[0]["plain_loss"] + ddp_grads[1]["plain_loss"]) / 2
    assert abs(plain - reference) > 1e-4


# --- the real CLI ---------------------------------------------------------------------------

SYNTH = [*TINY, "--synthetic", "--num-classes", "4", "--synthetic-size", "64", "--lr", "1"]
SYNTH += ["--warmup-epochs", "0", "--seed", "5", "--batch-size", "4", "--batch-weights", "3,1"]
SYNTH += ["--max-steps", "10", "--checkpoint-every", "4", "--keep-checkpoints", "5"]


@pytest.fixture(scope="module")
def weighted_2rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks, global batch 8 split 6 + 2; 8 steps per epoch, so 10 steps cross an epoch."""
    out = tmp_path_factory.mktemp("weighted2")
    proc = run_trainer([*SYNTH, "--output-dir", str(out)], nproc=2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_weighted_2rank_run_completes_with_the_split(weighted_2rank: Path) -> None:
    s = read_json(weighted_2rank / "summary.json")
    assert (s["status"], s["steps"], s["epoch"], s["world_size"]) == ("completed", 10, 1, 2)
    assert (s["global_batch"], s["per_rank_batch"], s["batch_weights"]) == (8, [6, 2], [3.0, 1.0])
    assert len(set(s["param_sha256_per_rank"])) == 1
    assert s["final_accuracy"] is not None
    for rank in (0, 1):
        assert read_json(weighted_2rank / "heartbeat" / f"rank-{rank}.json")["step"] == 10


@pytest.mark.slow
def test_weighted_resume_reaches_the_same_parameters(weighted_2rank: Path, tmp_path: Path) -> None:
    """From the step-4 checkpoint (epoch 0, batch 4): the same batches, the same weights."""
    (tmp_path / "checkpoints").mkdir()
    shutil.copy(weighted_2rank / "checkpoints" / "step-000000004.pt", tmp_path / "checkpoints")
    proc = run_trainer([*SYNTH, "--output-dir", str(tmp_path)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    resumed, full = read_json(tmp_path / "summary.json"), read_json(weighted_2rank / "summary.json")
    assert resumed["resumed_from_step"] == 4
    assert resumed["param_sha256_per_rank"] == full["param_sha256_per_rank"]


def test_unweighted_summary_shows_equal_batches(tmp_path: Path) -> None:
    args = [*TINY, "--synthetic", "--num-classes", "4", "--synthetic-size", "8", "--max-steps"]
    assert main([*args, "1", "--output-dir", str(tmp_path)]) == 0
    s = read_json(tmp_path / "summary.json")
    assert (s["per_rank_batch"], s["batch_weights"]) == ([2], None)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ("3,1", "--batch-weights 3,1: 2 weight(s) for 1 rank(s); give one per global rank"),
        ("fast", "--batch-weights fast: 'fast' is not a number"),
        ("0", "--batch-weights 0: weights must be positive (got 0.0)"),
    ],
)
def test_bad_weights_exit_2_with_one_line(
    weights: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--synthetic", "--batch-weights", weights, "--output-dir", str(tmp_path / "o")]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"trainer: error: {message}\n"


@pytest.mark.slow
def test_cli_bad_weights_exit_2_without_traceback(tmp_path: Path) -> None:
    proc = run_trainer([*SYNTH, "--batch-weights", "1,nan", "--output-dir", str(tmp_path)])
    assert proc.returncode == 2
    message = "--batch-weights 1,nan: weights must be finite (got nan)"
    assert proc.stderr == f"trainer: error: {message}\n"


@pytest.mark.slow
def test_2rank_zero_share_refused_by_every_rank_one_line(tmp_path: Path) -> None:
    """Each rank exits 2 before joining the group (torchrun itself then exits 1); only local
    rank 0 writes the line."""
    args = [*TINY, "--synthetic", "--batch-weights", "100,1", "--output-dir", str(tmp_path)]
    proc = run_trainer(args, nproc=2)
    message = "--batch-weights: rank 1's share of the global batch of 4 images rounds to 0"
    assert proc.returncode != 0
    assert proc.stderr.count(f"trainer: error: {message}; raise its weight or --batch-size\n") == 1
    # torchrun's failure report, one entry per rank (not its "failed (exitcode: 2)" log line).
    # A rank torchrun signals after its peer's exit while already finalising shows -15 (the
    # default handler is back then): that rank had refused too.
    exits = dict(re.findall(r"rank\s*:\s*(\d+) .*\n\s*exitcode\s*:\s*(-?\d+)", proc.stderr))
    assert exits.keys() == {"0", "1"}, proc.stderr[-2000:]
    assert "2" in exits.values(), proc.stderr[-2000:]
    assert set(exits.values()) <= {"2", "-15"}, proc.stderr[-2000:]
    assert not (tmp_path / "summary.json").exists()
