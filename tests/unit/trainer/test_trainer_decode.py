"""Decoding: the choice of path (with the CPU quota it counts), the plan (deterministic crops),
the reduced-size CPU decode, the GPU chain run on CPU tensors, and unreadable samples
(skipped, counted, or fatal)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from time_bounds import within
from trainer_helpers import read_json, run_trainer, trainer_env

import trainer.decode
from trainer.config import TrainConfig
from trainer.cpus import cpu_quota
from trainer.crops import Planner, crop_resize, draft_factor, random_resized_crop, sample_generator
from trainer.data import FolderImages, build_datasets, build_loader, mean_std, to_device
from trainer.decode import decode_choice, decode_cpu, loader_cores
from trainer.decode_gpu import KIND_DECODED, KIND_JPEG, EncodedBatch, collate_encoded, decode_batch
from trainer.inputs import BadSamplesError, InputPipeline
from trainer.make_dataset import write_dataset

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("requested", "device", "cores", "chosen"),
    [
        ("auto", "cuda", 0, "gpu"),
        ("auto", "cuda", 5, "gpu"),  # an H200 did more with nvJPEG up to 4 loader cores
        ("auto", "cuda", 6, "cpu"),  # and 1.5x more with 6 cores decoding
        ("auto", "cpu", 0, "cpu"),
        ("cpu", "cuda", 0, "cpu"),
        ("gpu", "cuda", 64, "gpu"),
    ],
)
def test_decode_choice(requested: str, device: str, cores: int, chosen: str) -> None:
    assert decode_choice(requested, device, cores) == chosen


@pytest.mark.parametrize(
    ("cpus", "quota", "workers", "local_ranks", "cores"),  # cpus: the process's affinity
    [
        (16, None, 8, 1, 8),  # one core per worker
        (16, None, 4, 1, 4),
        (16, None, 8, 2, 7),  # 8 CPUs per rank, one of them the rank's
        (8, None, 6, 1, 6),
        (4, None, 3, 1, 3),
        (2, None, 2, 1, 1),
        (64, 4.5, 8, 1, 3),  # docker --cpus 4.5 on a 64-core host
        (64, 0.5, 8, 1, 0),
        (2, None, 0, 1, 0),  # no workers: the rank decodes on the CPU itself
    ],
)
def test_loader_cores_are_the_workers_share_of_the_usable_cpus(
    monkeypatch: pytest.MonkeyPatch,
    *,
    cpus: int,
    quota: float | None,
    workers: int,
    local_ranks: int,
    cores: int,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    monkeypatch.setattr(trainer.decode, "cpu_quota", lambda: quota)
    assert loader_cores(workers, local_ranks) == cores


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "50000 100000\n"}, 0.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({}, None),
    ],
)
def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(str(tmp_path)) == expected


def test_gpu_decode_without_cuda_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a CUDA device"):
        decode_choice("gpu", "cpu")


def test_plan_is_the_crop_the_trainer_always_drew() -> None:
    """Same draws as before the decode paths existed: a resumed run sees the same crops."""
    g = sample_generator(3, 1, 17)
    box = random_resized_crop(500, 375, g)
    flip = torch.rand(1, generator=g).item() < 0.5
    assert Planner(224, True, 3)(500, 375, 1, 17) == (box, flip)
    assert Planner(224, True, 3)(500, 375, 2, 17) != (box, flip)


def test_val_plan_is_the_centre_crop_without_flip() -> None:
    assert Planner(224, False, 0)(512, 256, 5, 9) == ((144, 16, 368, 240), False)


@pytest.mark.parametrize(
    ("box", "factor"),
    [((0, 0, 447, 500), 1), ((0, 0, 448, 448), 2), ((0, 0, 900, 1000), 4), ((0, 0, 1900, 1800), 8)],
)
def test_draft_factor_keeps_the_decoded_box_at_least_the_output_size(box, factor) -> None:
    assert draft_factor(box, 224) == factor
    assert min(box[2] - box[0], box[3] - box[1]) // factor >= 224


def _jpeg(w: int, h: int, detail: int = 16) -> bytes:
    """A smooth random picture: noise at 1/detail of the size, scaled up."""
    g = torch.Generator().manual_seed(0)
    low = torch.randint(0, 256, (h // detail, w // detail, 3), generator=g, dtype=torch.uint8)
    img = Image.frombytes("RGB", (w // detail, h // detail), low.numpy().tobytes()).resize((w, h))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_reduced_size_decode_matches_the_full_size_decode() -> None:
    """A big source whose crop allows 1/8 scale: PIL's draft; the result is the same picture."""
    data = _jpeg(1600, 1200, detail=64)
    plan = Planner(64, False, 0)  # centre crop of 1,052 px: 1/8 scale still gives 131 px
    small = decode_cpu(data, plan, 0, 0)
    full = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    reference = crop_resize(full.permute(2, 0, 1), plan(1600, 1200, 0, 0)[0], False, 64)
    assert draft_factor(plan(1600, 1200, 0, 0)[0], 64) == 8
    assert small.shape == reference.shape == (3, 64, 64)
    assert small.dtype == torch.uint8
    assert (small.float() - reference.float()).abs().mean() < 3.0  # 8 px off: 9.3


def test_gpu_chain_on_cpu_tensors_matches_the_cpu_path(image_folder: Path) -> None:
    """Same samples through both paths: shapes, dtype, layout and normalised values agree."""
    cpu_ds = FolderImages(image_folder / "train", 24, train=True, seed=0)
    enc_ds = FolderImages(image_folder / "train", 24, train=True, seed=0, encoded=True)
    keys = [(1, i) for i in range(6)]
    cpu_batch = torch.stack([cpu_ds[k][0] for k in keys])
    labels = torch.tensor([cpu_ds[k][1] for k in keys])
    encoded = [enc_ds[k] for k in keys]
    batch = EncodedBatch.pack([e[0] for e in encoded], torch.tensor([e[1] for e in encoded]))
    pipe = InputPipeline(CPU, 24, channels_last=True, max_bad=0)
    x_gpu, y_gpu = pipe(batch, torch.tensor([e[2] for e in encoded]), enc_ds)
    x_cpu = to_device(cpu_batch, CPU, True, mean_std(CPU))
    assert x_gpu.shape == x_cpu.shape == (6, 3, 24, 24)
    assert x_gpu.dtype == x_cpu.dtype == torch.float32
    assert x_gpu.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y_gpu, labels)
    assert (x_gpu - x_cpu).abs().max() < 2 / 255 / 0.224  # at most a rounding step or two


def _corrupt_copy(src: Path, dst: Path) -> list[str]:
    """A copy of the image folder with one truncated and one garbage JPEG in class_01."""
    shutil.copytree(src, dst)
    victims = sorted((dst / "train" / "class_01").iterdir())[:2]
    victims[0].write_bytes(victims[0].read_bytes()[:300])
    victims[1].write_bytes(b"\xff\xd8\xff not a jpeg at all")
    return [str(v) for v in victims]


@pytest.mark.parametrize("encoded", [False, True])
def test_unreadable_samples_are_skipped_and_named(tmp_path: Path, image_folder, encoded) -> None:
    bad = _corrupt_copy(image_folder, tmp_path / "data")
    cfg = TrainConfig(data_dir=str(tmp_path / "data"), image_size=24, batch_size=24, workers=0)
    train, _, _ = build_datasets(cfg, encoded=encoded)
    loader = build_loader(train, cfg, 0, 1, pin=False, train=True)
    pipe = InputPipeline(CPU, 24, channels_last=False, max_bad=5)
    images, labels = next(iter(loader))
    x, y = pipe(images, labels, train)
    assert len(x) == len(y) == 22
    assert (y >= 0).all()
    assert sorted(pipe.bad_paths) == bad
    pipe.agree([pipe.unshared()])  # 2 <= 5: no error
    assert pipe.bad_total == 2


def test_too_many_unreadable_samples_fail_naming_them(tmp_path: Path, image_folder) -> None:
    bad = _corrupt_copy(image_folder, tmp_path / "data")
    cfg = TrainConfig(data_dir=str(tmp_path / "data"), image_size=24, batch_size=24, workers=0)
    train, _, _ = build_datasets(cfg)
    pipe = InputPipeline(CPU, 24, channels_last=False, max_bad=1)
    pipe(*next(iter(build_loader(train, cfg, 0, 1, pin=False, train=True))), train)
    with pytest.raises(
        BadSamplesError, match="2 unreadable samples, more than --max-bad-samples 1"
    ) as err:
        pipe.agree([pipe.unshared()])
    assert all(path in str(err.value) for path in bad)


def test_a_batch_of_only_unreadable_samples_comes_back_without_labels() -> None:
    """Not an error on this rank alone (the others would wait in DDP's all-reduce): the
    placeholder images come back with no labels, for a zero-weight step; the path counts."""
    meta = torch.tensor([[0, 0, 0, 8, 8, 0, 3], [0, 0, 0, 8, 8, 0, 5]])
    junk = torch.tensor([255, 216, 255, 0], dtype=torch.uint8)
    pipe = InputPipeline(CPU, 8, channels_last=False, max_bad=9)
    x, y = pipe(EncodedBatch.pack([junk, junk], meta), torch.tensor([1, 2]), [])
    assert x.shape == (2, 3, 8, 8)
    assert x.dtype == torch.float32
    assert y.shape == (0,)
    assert pipe.bad_paths == ["sample 3", "sample 5"]


def test_a_file_met_by_two_ranks_counts_once_against_the_limit() -> None:
    """Each rank meets the same bad file (another epoch's shuffle, the sampler's padding):
    one distinct file is not more than --max-bad-samples 1."""
    ranks = [InputPipeline(CPU, 8, channels_last=False, max_bad=1) for _ in range(2)]
    for pipe in ranks:
        pipe(torch.zeros((2, 3, 8, 8), dtype=torch.uint8), torch.tensor([0, -1 - 7]), [])
    gathered = [pipe.unshared() for pipe in ranks]
    for pipe in ranks:
        pipe.agree(gathered)
    assert [pipe.bad_total for pipe in ranks] == [1, 1]
    assert [pipe.unshared() for pipe in ranks] == [[], []]


def test_distinct_files_over_the_limit_fail_on_every_rank() -> None:
    ranks = [InputPipeline(CPU, 8, channels_last=False, max_bad=1) for _ in range(2)]
    for pipe, code in zip(ranks, (-1 - 7, -1 - 9), strict=True):
        pipe(torch.zeros((2, 3, 8, 8), dtype=torch.uint8), torch.tensor([0, code]), [])
    gathered = [pipe.unshared() for pipe in ranks]
    for pipe in ranks:
        with pytest.raises(
            BadSamplesError,
            match="2 unreadable samples, more than --max-bad-samples 1: sample 7, sample 9",
        ):
            pipe.agree(gathered)


def test_decode_batch_marks_what_nothing_can_decode() -> None:
    good = torch.frombuffer(bytearray(_jpeg(64, 48)), dtype=torch.uint8)
    broken = torch.frombuffer(bytearray(_jpeg(64, 48)[:200]), dtype=torch.uint8)
    meta = torch.tensor([[0, 0, 0, 40, 40, 1, 0], [0, 0, 0, 40, 40, 0, 1]])
    out, bad = decode_batch(EncodedBatch.pack([good, broken], meta), CPU, 16)
    assert out.shape == (2, 3, 16, 16)
    assert out.dtype == torch.uint8
    assert bad.tolist() == [False, True]


RUN = ["--arch", "resnet18", "--image-size", "32", "--batch-size", "4", "--workers", "0"]
RUN += ["--log-every", "1", "--epochs", "1", "--warmup-epochs", "0"]


def test_a_run_skips_unreadable_samples_and_counts_them(tmp_path: Path, image_folder) -> None:
    """Two gloo ranks: the run completes, summary.json counts and names both files."""
    bad = _corrupt_copy(image_folder, tmp_path / "data")
    out = tmp_path / "out"
    args = [*RUN, "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    proc = run_trainer(args, nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = read_json(out / "summary.json")
    assert summary["status"] == "completed"
    assert summary["bad_samples"] == 2
    assert summary["bad_sample_paths"] == bad


def test_a_run_with_too_many_unreadable_samples_fails_naming_them(tmp_path, image_folder) -> None:
    bad = _corrupt_copy(image_folder, tmp_path / "data")
    out = tmp_path / "out"
    args = [*RUN, "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    proc = run_trainer([*args, "--max-bad-samples", "1"], nproc=2)
    assert proc.returncode == 1
    summary = read_json(out / "summary.json")
    assert summary["status"] == "failed"
    assert summary["error"].startswith("BadSamplesError: 2 unreadable samples")
    assert all(path in summary["error"] for path in bad)


def _rank_batches(data: Path, epoch: int, rank: int) -> list[list[str]]:
    """The files of each of ``rank``'s training batches in ``epoch`` under RUN, 2 ranks."""
    cfg = TrainConfig(data_dir=str(data), image_size=32, batch_size=4, workers=0)
    train, _, _ = build_datasets(cfg)
    sampler = build_loader(train, cfg, rank, 2, pin=False, train=True).sampler
    sampler.set_epoch(epoch)
    paths = [train.folder.samples[i][0] for _, i in sampler]
    return [paths[k : k + 4] for k in range(0, len(paths) - 3, 4)]


def _break(paths: list[str]) -> None:
    for path in paths:
        Path(path).write_bytes(b"\xff\xd8\xff not a jpeg at all")


def test_a_file_both_ranks_meet_in_two_epochs_counts_once(tmp_path: Path, image_folder) -> None:
    """One bad file, on rank 0 in epoch 0 and on rank 1 in epoch 1: one distinct file is
    within --max-bad-samples 1 (it was counted twice and the run failed)."""
    data = tmp_path / "data"
    shutil.copytree(image_folder, data)
    on_0 = {p for b in _rank_batches(data, 0, 0) for p in b}
    on_1 = {p for b in _rank_batches(data, 1, 1) for p in b}
    victim = sorted(on_0 & on_1)[0]
    _break([victim])
    out = tmp_path / "out"
    args = [*RUN, "--epochs", "2", "--data-dir", str(data), "--output-dir", str(out)]
    proc = run_trainer([*args, "--max-bad-samples", "1"], nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = read_json(out / "summary.json")
    assert (summary["status"], summary["steps"]) == ("completed", 6)
    assert summary["bad_samples"] == 1
    assert summary["bad_sample_paths"] == [victim]


@pytest.mark.parametrize(("limit", "code", "status"), [(10, 0, "completed"), (3, 1, "failed")])
def test_a_rank_whose_whole_batch_is_unreadable_keeps_in_step(
    tmp_path: Path, image_folder, limit: int, code: int, status: str
) -> None:
    """Rank 1's first batch is 4 bad files: both ranks take the step (rank 1's weighs
    nothing) and the run completes; only --max-bad-samples under 4 ends it, on every rank."""
    data = tmp_path / "data"
    shutil.copytree(image_folder, data)
    victims = sorted(_rank_batches(data, 0, 1)[0])
    _break(victims)
    out = tmp_path / "out"
    args = [*RUN, "--data-dir", str(data), "--output-dir", str(out)]
    proc = run_trainer([*args, "--max-bad-samples", str(limit)], nproc=2, timeout=180)
    assert proc.returncode == code, proc.stderr[-2000:]
    summary = read_json(out / "summary.json")
    assert summary["status"] == status
    if status == "completed":
        assert (summary["steps"], summary["bad_samples"]) == (3, 4)
        assert summary["bad_sample_paths"] == victims
        assert len(set(summary["param_sha256_per_rank"])) == 1
    else:
        assert summary["error"].startswith("BadSamplesError: 4 unreadable samples")


def test_gpu_chain_on_cpu_tensors_matches_the_old_pil_path() -> None:
    """Against the PIL path the trainer had (full decode, resize(box), flip): same shape,
    dtype and normalisation, pixels within a resampling filter's difference."""
    plan = Planner(64, True, 7)
    files = [_jpeg(500, 375, detail=8), _jpeg(375, 500, detail=8)]
    reference = []
    for i, data in enumerate(files):
        img = Image.open(io.BytesIO(data)).convert("RGB")
        box, flip = plan(*img.size, 0, i)
        img = img.resize((64, 64), Image.BILINEAR, box=box)
        img = img.transpose(Image.FLIP_LEFT_RIGHT) if flip else img
        reference.append(torch.from_numpy(np.array(img)).permute(2, 0, 1))
    metas = []
    for i, data in enumerate(files):
        box, flip = plan(*Image.open(io.BytesIO(data)).size, 0, i)
        metas.append([0, *box, int(flip), i])
    batch = EncodedBatch.pack(
        [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in files], torch.tensor(metas)
    )
    x, _ = InputPipeline(CPU, 64, channels_last=True, max_bad=0)(batch, torch.tensor([0, 1]), [])
    want = to_device(torch.stack(reference), CPU, True, mean_std(CPU))
    assert x.shape == want.shape == (2, 3, 64, 64)
    assert x.dtype == want.dtype == torch.float32
    assert (x - want).abs().mean() < 0.01  # 0.6 grey levels (measured 0.2: the two filters)
    assert x.mean(dim=(0, 2, 3)) == pytest.approx(want.mean(dim=(0, 2, 3)).tolist(), abs=0.02)


# A loader in its own process under a low open-files limit: each tensor a worker hands over
# travels as a file descriptor, held until the rank takes the batch.
_LOADER_UNDER_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from trainer.config import TrainConfig
from trainer.data import build_datasets, build_loader
cfg = TrainConfig(data_dir=sys.argv[1], image_size=16, batch_size=128, workers=2)
train, _, _ = build_datasets(cfg, encoded=True)
print(sum(len(images) for images, _ in build_loader(train, cfg, 0, 1, pin=False, train=True)))
"""


def test_gpu_decoding_batches_pass_between_processes_under_a_low_open_files_limit(
    tmp_path: Path,
) -> None:
    """--decode gpu with loader workers and a soft limit of 256 open files (Docker CE gives
    containers 1024): 4 batches of 128 JPEGs reach the rank. A batch as one tensor per file
    needed 128 descriptors each, and the loader failed ("received 0 items of ancdata")."""
    write_dataset(tmp_path, classes=2, train_per_class=256, val_per_class=0, size=16)
    proc = subprocess.run(
        [sys.executable, "-c", _LOADER_UNDER_LIMIT, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=within(60),  # before the fix the loader hung after its error
    )
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert proc.stdout.split() == ["512"]


def test_a_png_among_jpegs_travels_as_its_image_and_lands_in_its_place(tmp_path: Path) -> None:
    """--decode gpu: the worker decodes a PNG itself; its finished image goes in the batch's
    one tensor as CHW bytes, and the rank puts it back in its place, pixel for pixel."""
    folder = tmp_path / "train" / "a"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"{i}.jpg").write_bytes(_jpeg(64, 48))
    Image.open(io.BytesIO(_jpeg(48, 64))).save(folder / "3.png")
    cpu_ds = FolderImages(tmp_path / "train", 24, train=True, seed=0)
    enc_ds = FolderImages(tmp_path / "train", 24, train=True, seed=0, encoded=True)
    batch, labels = collate_encoded([enc_ds[(0, i)] for i in range(4)])
    assert batch.meta[:, 0].tolist() == [KIND_JPEG] * 3 + [KIND_DECODED]
    out, bad = decode_batch(batch, CPU, 24)
    assert out.shape == (4, 3, 24, 24)
    assert not bad.any()
    assert torch.equal(out[3], cpu_ds[(0, 3)][0])
    assert labels.tolist() == [0, 0, 0, 0]


# The whole trainer with --decode gpu's pipeline, on the CPU: loader workers send JPEG bytes,
# the rank decodes each batch (torchvision's decoder on CPU tensors) and crops it there.
_GPU_PIPELINE_ON_CPU = """
import sys
import trainer.runner
trainer.runner.decode_choice = lambda *_args: "gpu"
from trainer.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_through_the_gpu_input_pipeline_on_cpu_completes_and_skips_bad_files(
    tmp_path: Path, image_folder: Path
) -> None:
    bad = _corrupt_copy(image_folder, tmp_path / "data")
    out = tmp_path / "out"
    args = [*RUN, "--workers", "2", "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    proc = subprocess.run(
        [sys.executable, "-c", _GPU_PIPELINE_ON_CPU, *args],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=within(240),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = read_json(out / "summary.json")
    assert (summary["status"], summary["decode"], summary["steps"]) == ("completed", "gpu", 6)
    assert summary["bad_sample_paths"] == bad
