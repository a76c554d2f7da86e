"""A run that goes on with fewer hosts (the agents' --min-hosts): the first attempt's global
batch split again among the ranks that remain, gradient accumulation where a share outgrows
what the rank took before, and an epoch that goes on at another world size without a sample
seen twice or skipped."""

from __future__ import annotations

import json
import subprocess
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from time_bounds import within
from torch import nn
from trainer_helpers import (
    TINY,
    free_port,
    tiny_mlp,
    tiny_samples,
    trainer_cmd,
    trainer_env,
)

from ddpfleet_agent.restarts import FULL_WORLD_ENV, KEPT_RANKS_ENV, WEIGHTS_ENV
from trainer.__main__ import main
from trainer.balance import WeightedDistributedSampler, attempt_batches, forward_backward
from trainer.balance import micro_batches as micro_count
from trainer.config import BadInputError
from trainer.metrics import ForwardTimer
from trainer.model import wrap_ddp
from trainer.resume import rebalanced_weights

# --- the shares -----------------------------------------------------------------------------


def test_a_full_attempt_keeps_its_shares() -> None:
    assert attempt_batches("", 32, 3) == ([32, 32, 32], [32, 32, 32])
    assert attempt_batches("3,1", 4, 2, 2, [0, 1]) == ([6, 2], [6, 2])


def test_fewer_ranks_split_the_same_global_batch_in_micro_batches() -> None:
    shares, most = attempt_batches("", 32, 2, 3, [0, 1])
    assert (shares, most) == ([48, 48], [32, 32])
    assert [micro_count(s, m) for s, m in zip(shares, most, strict=True)] == [2, 2]
    shares, most = attempt_batches("", 32, 2, 4, [0, 3])  # half the ranks: twice each
    assert (shares, [micro_count(s, m) for s, m in zip(shares, most, strict=True)]) == (
        [64, 64],
        [2, 2],
    )


def test_weights_split_the_global_batch_among_the_ranks_left() -> None:
    # first attempt: 96 images by 3,3,1 -> 41, 41, 14; without rank 1: 96 by 3,1 -> 72, 24
    shares, most = attempt_batches("3,3,1", 32, 2, 3, [0, 2])
    assert (shares, most) == ([72, 24], [41, 14])
    assert sum(shares) == 96
    assert [micro_count(s, m) for s, m in zip(shares, most, strict=True)] == [2, 2]


# --- the agents' weights after a rebalance ($DDPFLEET_BATCH_WEIGHTS) --------------------------


def _micro(shares: list[int], most: list[int]) -> list[int]:
    return [micro_count(s, m) for s, m in zip(shares, most, strict=True)]


def test_new_weights_move_images_to_the_faster_ranks_at_the_same_global_batch() -> None:
    shares, most = attempt_batches("", 32, 3, weights=[2.0, 1.0, 1.0])
    assert (shares, most) == ([48, 24, 24], [32, 32, 32])  # 96 images, as the first attempt
    assert _micro(shares, most) == [2, 1, 1]  # rank 0 now takes 48: in two forwards of 24


def test_new_weights_replace_the_first_attempt_s_and_keep_its_memory_bound() -> None:
    # first attempt: 8 images by --batch-weights 3,1 -> 6, 2; the agents now say 1,3
    shares, most = attempt_batches("3,1", 4, 2, weights=[1.0, 3.0])
    assert (shares, most) == ([2, 6], [6, 2])
    assert _micro(shares, most) == [1, 3]


def test_new_weights_of_a_shrunk_world_are_the_kept_ranks_in_kept_order() -> None:
    # first attempt: 96 by 3,3,1 -> 41, 41, 14; ranks 2 and 0 remain (in that order) and the
    # agents weigh the first world 1,5,3: the kept ranks' 3 and 1 split the 96
    shares, most = attempt_batches("3,3,1", 32, 2, 3, [2, 0], weights=[1.0, 5.0, 3.0])
    assert (shares, most) == ([72, 24], [14, 41])
    assert _micro(shares, most) == [6, 1]


def test_without_new_weights_the_split_is_today_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    assert rebalanced_weights() is None
    monkeypatch.setenv(WEIGHTS_ENV, " ")
    assert rebalanced_weights() is None
    assert attempt_batches("3,3,1", 32, 2, 3, [0, 2], weights=None) == ([72, 24], [41, 14])
    monkeypatch.setenv(WEIGHTS_ENV, "0.5,2,1")
    assert rebalanced_weights() == [0.5, 2.0, 1.0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1,x", "$DDPFLEET_BATCH_WEIGHTS 1,x: 'x' is not a number"),
        ("1,,1", "$DDPFLEET_BATCH_WEIGHTS 1,,1: '' is not a number"),
        ("1,0", "$DDPFLEET_BATCH_WEIGHTS 1,0: weights must be positive (got 0.0)"),
        ("-1,2", "$DDPFLEET_BATCH_WEIGHTS -1,2: weights must be positive (got -1.0)"),
        ("1,inf", "$DDPFLEET_BATCH_WEIGHTS 1,inf: weights must be finite (got inf)"),
    ],
)
def test_malformed_new_weights_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv(WEIGHTS_ENV, value)
    with pytest.raises(BadInputError) as refused:
        rebalanced_weights()
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([1.0, 1.0], "$DDPFLEET_BATCH_WEIGHTS: 2 weight(s) for the first attempt's 3 rank(s)"),
        ([1.0] * 4, "$DDPFLEET_BATCH_WEIGHTS: 4 weight(s) for the first attempt's 3 rank(s)"),
        ([1000.0, 1.0, 1.0], "$DDPFLEET_BATCH_WEIGHTS: rank 1's share of the global batch of 6"),
    ],
)
def test_new_weights_must_name_each_rank_of_the_first_world(weights, message) -> None:
    """Counted against the first world, also when fewer ranks remain; no share rounds to 0."""
    with pytest.raises(BadInputError) as refused:
        attempt_batches("", 2, 2, 3, [0, 1], weights=weights)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("kept", [[0], [0, 0], [0, 5], [-1, 1]])
def test_kept_ranks_must_name_the_world(kept: list[int]) -> None:
    with pytest.raises(BadInputError, match="kept ranks"):
        attempt_batches("", 8, 2, 3, kept)


# --- the sampler across world sizes ---------------------------------------------------------


def _steps(n: int, shares: list[int], epoch: int, start: int, stop: int) -> list[list[int]]:
    """Every rank's indices of steps start..stop-1 of the epoch (each rank resumed at start)."""
    out = []
    for rank in range(len(shares)):
        sampler = WeightedDistributedSampler(n, shares, rank, seed=3)
        sampler.set_epoch(epoch)
        sampler.set_start_batch(start, batch_size=0)
        out.append([i for _, i in list(sampler)[: (stop - start) * shares[rank]]])
    return out


@pytest.mark.parametrize(
    ("n", "before", "after", "cut"),
    [
        (1000, [32, 32, 32], [48, 48], 4),  # 3 hosts -> 2, equal shares
        (1000, [41, 41, 14], [72, 24], 7),  # weighted
        (500, [8, 8, 8, 8], [11, 11, 10], 1),  # 4 -> 3: 32 does not divide by 3
        (333, [16, 16], [32], 9),  # down to one rank, at the epoch's last step
        (1000, [32, 32, 32], [48, 24, 24], 4),  # a rebalance: the same ranks, new shares
        (500, [41, 41, 14], [20, 60, 16], 2),
        (500, [6, 2], [2, 6], 0),  # from the epoch's first step
    ],
)
def test_an_epoch_resumed_at_another_world_size_sees_each_sample_once(n, before, after, cut):
    """The first ``cut`` steps at one world size, the rest of the epoch at another (the same
    global batch): together exactly the epoch's images, none twice, none skipped."""
    size = sum(before)
    assert sum(after) == size
    steps = n // size
    first = [i for part in _steps(n, before, 2, 0, cut) for i in part]
    rest = [i for part in _steps(n, after, 2, cut, steps) for i in part]
    seen = first + rest
    assert len(seen) == len(set(seen)) == steps * size  # none twice, none skipped
    whole = [i for part in _steps(n, before, 2, 0, steps) for i in part]
    assert set(seen) == set(whole)  # the same images as the epoch at one world size
    for s in range(cut, steps):  # step by step, not just in total
        at = {
            i
            for part, b in zip(_steps(n, after, 2, s, s + 1), after, strict=True)
            for i in part[:b]
        }
        was = {
            i
            for part, b in zip(_steps(n, before, 2, s, s + 1), before, strict=True)
            for i in part[:b]
        }
        assert at == was


# --- gradient accumulation ------------------------------------------------------------------

SHARES, MICRO = [5, 3], [3, 1]  # rank 0 takes its 5 images in 3 pieces (2, 2, 1)


def _rank(rank: int, port: int, out: str) -> None:
    """One gloo rank: the trainer's forward_backward over its share, in MICRO[rank] pieces."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = wrap_ddp(tiny_mlp(), torch.device("cpu"), 2, static=False)
    x, y = tiny_samples(sum(SHARES))
    lo = sum(SHARES[:rank])
    cpu = types.SimpleNamespace(device=torch.device("cpu"))
    run = types.SimpleNamespace(
        model=model, criterion=nn.CrossEntropyLoss(), env=cpu, amp_dtype=None,
        loss_scale=SHARES[rank] * 2 / sum(SHARES), micro=MICRO[rank],
        scaler=torch.amp.GradScaler("cpu", enabled=False), forward_time=ForwardTimer(),
    )  # fmt: skip
    loss = forward_backward(run, x[lo : lo + SHARES[rank]], y[lo : lo + SHARES[rank]])
    grads = [p.grad.detach().clone() for p in model.parameters()]
    torch.save({"grads": grads, "loss": loss.detach()}, Path(out) / f"rank-{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_accumulated_ddp_gradient_is_the_global_batch_mean(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank-{r}.pt", weights_only=True) for r in (0, 1)]
    model = tiny_mlp()
    x, y = tiny_samples(sum(SHARES))
    loss = nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    for rank in got:  # the same all-reduced gradient on both ranks, that of all 8 at once
        for have, want in zip(rank["grads"], [p.grad for p in model.parameters()], strict=True):
            torch.testing.assert_close(have, want, atol=1e-12, rtol=0)
    mean = (got[0]["loss"] + got[1]["loss"]).double() / 2  # as _log_interval averages them
    torch.testing.assert_close(mean, loss.detach(), atol=1e-6, rtol=0)  # summed in float32


# --- the real CLI ---------------------------------------------------------------------------

ARGS = [*TINY, "--synthetic", "--num-classes", "4", "--synthetic-size", "64", "--seed", "5"]
ARGS += ["--max-steps", "6", "--checkpoint-every", "3", "--keep-checkpoints", "5"]


@pytest.mark.slow
def test_a_run_goes_on_with_one_of_its_two_ranks_at_the_same_global_batch(tmp_path: Path) -> None:
    """2 ranks for 6 steps; then rank 0 alone from the step-3 checkpoint, as its agent restarts
    it without the other host: the global batch stays 4 (2 x 2), taken in 2 micro-batches that
    are the two ranks' shares, so steps 4-6 redo the same maths: the same losses."""
    out = ["--output-dir", str(tmp_path)]
    two = subprocess.run(trainer_cmd([*ARGS, *out], nproc=2), env=trainer_env(), text=True,
                         capture_output=True, timeout=within(240), check=False)  # fmt: skip
    assert two.returncode == 0, two.stderr[-2000:]
    before = _losses(tmp_path)
    (tmp_path / "checkpoints" / "step-000000006.pt").unlink()  # as if it failed after step 5
    env = trainer_env(**{FULL_WORLD_ENV: "2", KEPT_RANKS_ENV: "0", "DDPFLEET_RESTART": "1"})
    one = subprocess.run(trainer_cmd([*ARGS, *out], nproc=1), env=env, capture_output=True,
                         text=True, timeout=within(240), check=False)  # fmt: skip
    assert one.returncode == 0, one.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["world_size"], summary["steps"], summary["resumed_from_step"]) == (1, 6, 3)
    assert (summary["global_batch"], summary["per_rank_batch"]) == (4, [4])
    after = _losses(tmp_path)
    assert list(after) == [1, 2, 3, 4, 5, 6]  # the epoch went on where it was
    for step in (4, 5, 6):
        assert after[step] == pytest.approx(before[step], rel=1e-3), (before, after)


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def test_malformed_new_weights_exit_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(WEIGHTS_ENV, "1,1")  # two weights for a first world of one rank
    assert main([*ARGS, "--output-dir", str(tmp_path)]) == 2
    message = (
        "$DDPFLEET_BATCH_WEIGHTS: 2 weight(s) for the first attempt's 1 rank(s); "
        "give one per global rank of the first world"
    )
    assert capsys.readouterr().err == f"trainer: error: {message}\n"


@pytest.mark.slow
def test_a_rebalanced_run_takes_the_agents_shares_in_micro_batches(tmp_path: Path) -> None:
    """--batch-weights 3,1 sized the ranks for 6 and 2 images; the agents' 1,3 give 2 and 6,
    so rank 1 takes its 6 in 3 forwards of 2 and the global batch stays 8."""
    args = [*ARGS, "--batch-size", "4", "--batch-weights", "3,1", "--output-dir", str(tmp_path)]
    env = trainer_env(**{WEIGHTS_ENV: "1,3"})
    proc = subprocess.run(trainer_cmd(args, nproc=2), env=env, capture_output=True, text=True,
                          timeout=within(240), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["global_batch"], summary["per_rank_batch"]) == (8, [2, 6])
    assert len(set(summary["param_sha256_per_rank"])) == 1
    beats = [json.loads((tmp_path / "heartbeat" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(b["batch"], b["micro_batches"]) for b in beats] == [(2, 1), (6, 3)]
