"""train.yml with a user's program (train_program, train_code_dir): a missing or badly named
program is refused in one line before any host is contacted (the sample's hosts do not exist)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_run_validate import train


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "run.py").write_text("")
    return tmp_path


def refused(extra: dict, line: str) -> None:
    proc = train({"run_id": "r1", **extra})
    assert proc.returncode != 0
    assert line in proc.stdout, proc.stdout[-2000:]
    assert "UNREACHABLE" not in proc.stdout


@pytest.mark.parametrize(
    ("program", "looked"),
    [
        ("missing.py", "{d}/missing.py"),
        ("pkg.nope", "{d}/pkg/nope.py and {d}/pkg/nope/__main__.py"),
    ],
)
def test_a_program_missing_from_the_code_dir_is_refused(code_dir, program, looked) -> None:
    refused(
        {"train_program": program, "train_code_dir": str(code_dir)},
        f"train_program {program} is not in train_code_dir "
        f"(looked for {looked.format(d=code_dir)})",
    )


@pytest.mark.parametrize(
    "program", ["bad name", "-m x", "../escape.py", "a..b", "pkg.", "2fast.train"]
)
def test_a_badly_named_program_is_refused(code_dir, program) -> None:
    refused(
        {"train_program": program, "train_code_dir": str(code_dir)},
        f'invalid train_program "{program}": give a Python module (pkg.train) or a script',
    )


def test_a_missing_code_dir_is_refused(tmp_path) -> None:
    refused(
        {"train_program": "train.py", "train_code_dir": str(tmp_path / "nope")},
        f"train_code_dir {tmp_path / 'nope'} is not a directory on the controller",
    )


def test_a_code_dir_without_a_program_is_refused(code_dir) -> None:
    refused(
        {"train_code_dir": str(code_dir), "train_synthetic": True},
        "is set but train_program is not",
    )


def test_a_relative_script_without_a_code_dir_is_refused() -> None:
    refused({"train_program": "train.py"}, "a script in the image needs an absolute path")


def test_program_args_must_be_a_list() -> None:
    refused(
        {"train_program": "pkg.run", "train_program_args": "--epochs 3"},
        "train_program_args must be a list of strings",
    )


@pytest.mark.parametrize("program", ["train.py", "pkg.run"])
def test_a_program_in_the_code_dir_passes_without_data_options(code_dir, program) -> None:
    # no train_data_dir/train_synthetic: the program takes its data from its own arguments.
    # Past validation the play contacts the (nonexistent) sample hosts: unreachable.
    proc = train({"run_id": "r1", "train_program": program, "train_code_dir": str(code_dir),
                  "train_program_args": ["--epochs", 3], "ansible_ssh_timeout": 2})  # fmt: skip
    assert "UNREACHABLE" in proc.stdout, proc.stdout[-2000:]
    assert "train_program" not in proc.stdout
    assert "train_data_dir" not in proc.stdout
