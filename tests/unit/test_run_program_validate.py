"""train_program and train_code_dir (a user's program instead of ddpfleet's trainer): a missing
or badly named program is refused in one line on the controller (ddpfleet_run_validate)."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainer.request as validate


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "run.py").write_text("")
    return tmp_path


@pytest.mark.parametrize(
    ("program", "looked"),
    [
        ("missing.py", "{d}/missing.py"),
        ("pkg.nope", "{d}/pkg/nope.py and {d}/pkg/nope/__main__.py"),
    ],
)
def test_a_program_missing_from_the_code_dir_is_refused(code_dir, program, looked) -> None:
    assert validate.program_problem(program, f"{code_dir}/") == (
        f"train_program {program} is not in train_code_dir (looked for {looked.format(d=code_dir)})"
    )


@pytest.mark.parametrize(
    "program", ["bad name", "-m x", "../escape.py", "a..b", "pkg.", "2fast.train", "a\nb.py"]
)
def test_a_badly_named_program_is_refused(code_dir, program) -> None:
    assert validate.program_problem(program, str(code_dir)).startswith(
        f'invalid train_program "{program}": give a Python module (pkg.train) or a script'.replace(
            "\n", "\\n"
        )
    )


def test_a_missing_code_dir_is_refused(tmp_path) -> None:
    assert validate.program_problem("train.py", str(tmp_path / "nope")) == (
        f"train_code_dir {tmp_path / 'nope'} is not a directory on the controller"
    )


def test_a_code_dir_without_a_program_is_refused(code_dir) -> None:
    assert "is set but train_program is not" in validate.program_problem("", str(code_dir))


def test_a_relative_script_without_a_code_dir_is_refused() -> None:
    assert "a script in the image needs an absolute path" in validate.program_problem(
        "train.py", ""
    )


def test_an_absolute_script_in_a_code_dir_is_refused(code_dir) -> None:
    found = validate.program_problem(f"{code_dir}/train.py", str(code_dir))
    assert found.endswith("a script in train_code_dir needs a path relative to it")


@pytest.mark.parametrize(("program", "code"), [("/opt/t.py", False), ("pkg.mod", False),
                                               ("train.py", True), ("pkg.run", True)])  # fmt: skip
def test_a_program_where_it_will_run_from_passes(code_dir, program, code) -> None:
    assert validate.program_problem(program, str(code_dir) if code else "") == ""
