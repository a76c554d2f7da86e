"""ddpfleet_files (action_plugins/, library/): many files and directories settled in one module
run when they are right, and written by the real copy and template actions when not; run for
real on localhost as root, and its node side as functions on a temporary directory."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from plugin_loader import load_plugin, local_playbook

node = load_plugin("ddpfleet_files_node", "library/ddpfleet_files.py")

ROOT_IDS = {"owner": "root", "group": "root"}


def _entry(dest: Path, kind: str = "file", mode: str = "0644", text: str | None = None) -> dict:
    entry = {"dest": str(dest), "state": kind, "mode": mode, **ROOT_IDS}
    if text is not None:
        entry["checksum"] = hashlib.sha1(text.encode()).hexdigest()
    return entry


def test_a_missing_directory_is_created_with_its_parents(tmp_path: Path) -> None:
    dest = tmp_path / "a" / "b"
    status, diff = node.settle(_entry(dest, "directory", "0750"), check=False)
    assert status == "created"
    assert diff["after"]["state"] == "directory"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750


def test_check_mode_reports_and_changes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "d"
    assert node.settle(_entry(dest, "directory"), check=True)[0] == "created"
    assert not dest.exists()
    f = tmp_path / "f"
    f.write_text("x")
    f.chmod(0o600)
    assert node.settle(_entry(f, mode="0644", text="x"), check=True)[0] == "attributes"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600


def test_a_file_is_left_to_the_action_unless_its_content_matches(tmp_path: Path) -> None:
    f = tmp_path / "f"
    assert node.settle(_entry(f, text="new"), check=False) == ("content", {})  # missing
    f.write_text("old")
    assert node.settle(_entry(f, text="new"), check=False) == ("content", {})  # differs
    f.chmod(0o600)
    status, diff = node.settle(_entry(f, mode="0644", text="old"), check=False)
    assert status == "attributes"
    assert (diff["before"]["mode"], diff["after"]["mode"]) == ("0600", "0644")
    assert stat.S_IMODE(f.stat().st_mode) == 0o644
    assert node.settle(_entry(f, mode="0644", text="old"), check=False) == ("ok", {})


def test_numeric_ids_and_setgid_modes(tmp_path: Path) -> None:
    dest = tmp_path / "shared"
    entry = {**_entry(dest, "directory", "2775"), "owner": "0", "group": "0"}
    assert node.settle(entry, check=False)[0] == "created"
    assert f"{stat.S_IMODE(dest.stat().st_mode):04o}" == "2775"
    assert node.settle(entry, check=False)[0] == "ok"


def test_bad_input_is_named(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        node.settle(_entry(f, "directory"), check=False)
    with pytest.raises(ValueError, match="no such user or group"):
        node.settle({**_entry(f, text="x"), "owner": "no-such-user-here"}, check=False)
    with pytest.raises(ValueError, match="not octal"):
        node.settle(_entry(f, mode="u+rw", text="x"), check=False)


SHOW = "STATUS {{ out.results | map(attribute='status') | join(',') }}"


def _book(tmp_path: Path, files: list[dict], name: str = "play", **task: object) -> Path:
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "templates" / "conf.j2").write_text(
        "# {{ who }}\n{% for n in range(2) %}\nline {{ n }}\n{% endfor %}\nend\n"
    )
    (tmp_path / "files" / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    play = [{"hosts": "localhost", "gather_facts": False, "vars": {"who": "world"}, "tasks": [
        {"name": "Settle", "ddpfleet_files": {"files": files}, "register": "out", **task},
        {"name": "Show", "ansible.builtin.debug": {"msg": SHOW}},
        {"name": "Reference render", "ansible.builtin.template": {
            "src": "conf.j2", "dest": str(tmp_path / "reference.conf"), "mode": "0644"}},
    ]}]  # fmt: skip
    book = tmp_path / f"{name}.yml"
    book.write_text(json.dumps(play))
    return book


def _statuses(out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if "STATUS " in ln)
    return line.split("STATUS ", 1)[1].strip().strip('"').split(",")


@pytest.mark.skipif(os.geteuid() != 0, reason="sets root ownership: the unit tier runs as root")
def test_the_action_writes_settles_and_repairs_for_real(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    files = [
        {"dest": str(out_dir)},
        {"dest": str(out_dir / "conf"), "template": "conf.j2"},
        {"dest": str(out_dir / "tool"), "src": "tool.sh", "mode": "0755"},
        {"dest": str(out_dir / "note"), "content": "a note\n", "mode": "0600"},
    ]
    book = _book(tmp_path, files)
    first = local_playbook(book)
    assert first.startswith("rc=0"), first
    assert _statuses(first) == ["created", "content", "content", "content"]
    # Rendered as ansible.builtin.template renders it: the same bytes.
    assert (out_dir / "conf").read_bytes() == (tmp_path / "reference.conf").read_bytes()
    assert stat.S_IMODE((out_dir / "tool").stat().st_mode) == 0o755
    assert (out_dir / "note").read_text() == "a note\n"

    again = local_playbook(book)
    assert _statuses(again) == ["ok", "ok", "ok", "ok"], again
    assert "changed=0" in again

    (out_dir / "conf").write_text("drifted\n")
    (out_dir / "tool").chmod(0o700)
    checked = local_playbook(_book(tmp_path, files, "check", check_mode=True))
    assert _statuses(checked) == ["ok", "content", "attributes", "ok"], checked
    assert (out_dir / "conf").read_text() == "drifted\n"  # check mode changed nothing
    assert stat.S_IMODE((out_dir / "tool").stat().st_mode) == 0o700

    repaired = local_playbook(_book(tmp_path, files, "diff", diff=True))
    assert repaired.startswith("rc=0"), repaired
    assert "-drifted" in repaired  # the content's diff is shown
    assert "+line 0" in repaired
    assert (out_dir / "conf").read_bytes() == (tmp_path / "reference.conf").read_bytes()
    assert stat.S_IMODE((out_dir / "tool").stat().st_mode) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="sets root ownership: the unit tier runs as root")
def test_a_file_that_fails_validation_is_not_written(tmp_path: Path) -> None:
    dest = tmp_path / "checked"
    dest.write_text("good\n")
    files = [{"dest": str(dest), "content": "bad\n", "validate": "grep -q good %s"}]
    out = local_playbook(_book(tmp_path, files))
    assert out.startswith("rc=2"), out
    assert str(dest) in out
    assert dest.read_text() == "good\n"
