from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.config import BadInputError, TrainConfig
from trainer.data import (
    EpochSampler,
    FolderImages,
    SyntheticImages,
    build_datasets,
    build_loader,
    mean_std,
    to_device,
)


def test_synthetic_is_uint8_deterministic_and_labelled() -> None:
    a = SyntheticImages(64, 5, 16, seed=3)
    b = SyntheticImages(64, 5, 16, seed=3)
    img, label = a[7]
    assert img.dtype == torch.uint8
    assert img.shape == (3, 16, 16)
    assert 0 <= label < 5
    assert torch.equal(img, b[(2, 7)][0])


def test_loader_workers_are_forked_even_where_the_default_start_method_is_spawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank started by torch.multiprocessing.spawn defaults to spawn (Python 3.14: forkserver),
    where each worker re-imports the main module and is sent the sample list in turn."""
    import multiprocessing  # noqa: PLC0415 - only this test changes its default

    monkeypatch.setattr(multiprocessing.context._default_context, "_actual_context", None)
    multiprocessing.set_start_method("spawn")
    cfg = TrainConfig(synthetic=True, num_classes=4, image_size=8, batch_size=4, workers=2)
    loader = build_loader(SyntheticImages(16, 4, 8, 0), cfg, 0, 1, pin=False, train=True)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert multiprocessing.get_start_method() == "spawn"
    assert sum(len(labels) for _, labels in loader) == 16


def test_the_validation_sampler_yields_its_shard_with_the_epoch() -> None:
    part = EpochSampler(range(40), num_replicas=2, rank=1, shuffle=False)
    part.set_epoch(3)
    assert [i for _, i in part] == list(range(1, 40, 2))
    assert all(epoch == 3 for epoch, _ in part)


def test_folder_augmentation_depends_only_on_seed_epoch_index(image_folder: Path) -> None:
    ds = FolderImages(image_folder / "train", 24, train=True, seed=0)
    assert torch.equal(ds[(1, 5)][0], ds[(1, 5)][0])
    assert not torch.equal(ds[(1, 5)][0], ds[(2, 5)][0])
    assert ds[(1, 5)][0].shape == (3, 24, 24)


def test_datasets_from_folder_count_classes(image_folder: Path) -> None:
    train, val, classes = build_datasets(TrainConfig(data_dir=str(image_folder), image_size=24))
    assert (len(train), len(val), classes) == (24, 6, 3)


def test_empty_class_folder_is_bad_input(tmp_path: Path, image_folder: Path) -> None:
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "train" / "b").mkdir()
    src = next((image_folder / "train" / "class_00").iterdir())
    (tmp_path / "train" / "a" / "x.jpg").write_bytes(src.read_bytes())
    with pytest.raises(BadInputError, match="without images: b"):
        build_datasets(TrainConfig(data_dir=str(tmp_path)))


def test_normalisation_on_device_keeps_channels_last() -> None:
    x = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    y = to_device(x, torch.device("cpu"), True, mean_std(torch.device("cpu")))
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert y[0, 0, 0, 0].item() == pytest.approx((1 - 0.485) / 0.229, rel=1e-5)
