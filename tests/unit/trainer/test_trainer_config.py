from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import BadInputError, TrainConfig, check_output_dir, parse_config


def test_defaults_match_the_issue() -> None:
    cfg = parse_config(["--synthetic"])
    assert (cfg.image_size, cfg.resume, cfg.amp, cfg.channels_last) == (224, "auto", "auto", True)
    assert cfg.num_classes == 1000


def test_no_channels_last_flag() -> None:
    assert parse_config(["--synthetic", "--no-channels-last"]).channels_last is False


def test_data_dir_resolves_classes_later(image_folder: Path) -> None:
    cfg = parse_config(["--data-dir", str(image_folder)])
    assert cfg.num_classes == 0
    assert cfg.data_dir == str(image_folder)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--synthetic", "--batch-size", "-1"], "--batch-size must not be negative"),
        (["--synthetic", "--max-bad-samples", "-1"], "--max-bad-samples must not be negative"),
        (["--synthetic", "--max-steps", "-1"], "--max-steps must not be negative"),
        (["--synthetic", "--num-classes", "1"], "--num-classes must be at least 2"),
        (["--synthetic", "--batch-size", "70000"], "--batch-size must be at most 65536"),
        (["--synthetic", "--dist-timeout", "1e10"], "--dist-timeout must be at most 604800"),
        (["--synthetic", "--epochs", "0"], "--epochs must be at least 1"),
        ([], "exactly one of --data-dir DIR or --synthetic"),
        (["--data-dir", "/nonexistent/x"], "--data-dir /nonexistent/x: no such directory"),
        (["--synthetic", "--resume", "/nonexistent/c.pt"], "--resume /nonexistent/c.pt: no such"),
    ],
)
def test_bad_options_raise_one_clear_message(argv: list[str], message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        parse_config(argv)


def test_unknown_option_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["--synthetic", "--amp", "fp8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("trainer: error: argument --amp")


def test_output_dir_is_created(tmp_path: Path) -> None:
    check_output_dir(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []


def test_output_dir_under_a_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadInputError, match="cannot create"):
        check_output_dir(str(tmp_path / "f" / "out"))


def test_config_round_trips_through_dataclass() -> None:
    cfg = parse_config(["--synthetic", "--lr", "0.2"])
    assert isinstance(cfg, TrainConfig)
    assert cfg.lr == 0.2
