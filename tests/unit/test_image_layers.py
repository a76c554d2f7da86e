"""images/trainer/layers.py: the image's Python stack installed in layers, each package once."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from plugin_loader import ROOT, load_plugin

layers = load_plugin("ddpfleet_image_layers", "images/trainer/layers.py")
# the trainer_image role's vars/main.yml as Ansible reads it (its values are templates)
ROLE_VARS = DataLoader().load_from_file(str(ROOT / "roles/trainer_image/vars/main.yml"))


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("nvidia-cudnn-cu13", 1),
        ("nvidia_cudnn_cu13", 1),
        ("torch", 2),
        ("nvidia-cublas", 3),
        ("nvidia-cusparse", 3),
        ("nvidia-cusparselt-cu13", layers.LAYERS),
        ("Triton", 4),
        ("nvidia-nccl-cu13", 4),
        ("nvidia-cufft", 5),
        ("torchvision", layers.LAYERS),
        ("a-package-nobody-named", layers.LAYERS),
    ],
)
def test_each_package_has_one_layer_and_unknown_ones_go_last(name: str, layer: int) -> None:
    assert layers.layer_of(name) == layer


def test_the_dockerfile_installs_every_layer_in_order() -> None:
    steps = [
        line.split()[-1]
        for line in (ROOT / "images/trainer/Dockerfile").read_text().splitlines()
        if line.startswith("RUN python /opt/ddpfleet/build/layers.py")
    ]
    assert steps == ["plan", *(str(n) for n in range(1, layers.LAYERS + 1))]


def wheel(
    folder: Path,
    name: str,
    version: str,
    requires: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> None:
    """A minimal, real wheel of one module named like the project (and ``extra`` files)."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}.py": b"",
        **{path: f"{path}\n".encode() for path in extra},
        f"{info}/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
            + [f"Requires-Dist: {req}" for req in requires]
        ).encode()
        + b"\n",
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)


def test_plan_then_every_layer_installs_exactly_the_resolved_stack(tmp_path: Path) -> None:
    """Real pip on a wheelhouse: the plan holds the pins and their dependencies, layer 1 installs
    only its group, the last one the rest, and the stack then passes pip check."""
    houses = tmp_path / "wheelhouse"
    houses.mkdir()
    wheel(houses, "torch", "2.0", ("nvidia-cudnn-cu13==9.1", "helper"))
    # with GPU_LIBRARIES=leave-out, cuDNN's shim and graph library stay, its engines go (GPU_ONLY)
    cudnn_libs = ("libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9")
    wheel(
        houses, "nvidia-cudnn-cu13", "9.1", extra=tuple(f"nvidia/cudnn/lib/{n}" for n in cudnn_libs)
    )
    wheel(houses, "nvidia-cudnn-cu13", "9.2")
    wheel(houses, "helper", "1.0")
    build = tmp_path / "build"
    build.mkdir()
    shutil.copy(ROOT / "images/trainer/layers.py", build)
    (build / "requirements.txt").write_text("torch==2.0\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin/python")
    env = {
        "WHEELHOUSE_URL": str(houses),
        "GPU_LIBRARIES": "leave-out",  # as the role passes it where no trainer has a GPU
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PATH": "/usr/bin:/bin",
    }

    def installed() -> set[str]:
        listing = subprocess.run(
            [python, "-m", "pip", "list", "--format=json"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        found = {f"{p['name']}=={p['version']}" for p in json.loads(listing)}
        return {pin for pin in found if not pin.startswith(("pip==", "setuptools=="))}

    def step(*args: str) -> None:
        subprocess.run([python, str(build / "layers.py"), *args], check=True, env=env)

    step("plan")
    assert json.loads((build / "plan.json").read_text()) == [
        "helper==1.0",
        "nvidia-cudnn-cu13==9.1",
        "torch==2.0",
    ]
    step("install", "1")
    assert installed() >= {"nvidia-cudnn-cu13==9.1"}
    assert not installed() & {"torch==2.0", "helper==1.0"}
    site = next(venv.glob("lib/python3*/site-packages"))
    assert sorted(p.name for p in (site / "nvidia/cudnn/lib").iterdir()) == [
        "libcudnn.so.9",
        "libcudnn_graph.so.9",
    ], "GPU_LIBRARIES=leave-out kept a GPU-only library"
    first = {p: p.stat().st_mtime_ns for p in site.glob("__pycache__/nvidia_cudnn_cu13.*.pyc")}
    assert first, "layer 1 left its modules without .pyc"
    step("install", "2")
    assert "torch==2.0" in installed()
    assert list(site.glob("__pycache__/torch.*.pyc")), "layer 2 left its modules without .pyc"
    # layer 1's .pyc are only read by layer 2's compile (a rewrite would copy them into it)
    assert {p: p.stat().st_mtime_ns for p in first} == first
    for layer in range(3, layers.LAYERS + 1):
        step("install", str(layer))
    assert installed() >= {"helper==1.0", "nvidia-cudnn-cu13==9.1", "torch==2.0"}


def tree(root: Path, *files: str) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * 10)


GPU_AND_CPU_FILES = (
    "nvidia/cudnn/lib/libcudnn.so.9",
    "nvidia/cudnn/lib/libcudnn_graph.so.9",
    "nvidia/cudnn/lib/libcudnn_ops.so.9",
    "nvidia/cu13/lib/libcublasLt.so.13",
    "nvidia/cu13/lib/libcusolverMg.so.12",
    "nvidia/cu13/lib/libnvrtc.so.13",
    "nvidia/cu13/lib/libnvrtc.alt.so.13",
    "triton/__init__.py",
    "triton/_C/libtriton.so",
    "triton/backends/nvidia/bin/ptxas",
    "triton/backends/nvidia/lib/cupti/libcupti.so",
    "triton/backends/nvidia/compiler.py",
    "torch/lib/libtorch_cuda.so",
)


def test_without_gpus_the_layers_leave_out_what_only_a_gpu_loads(tmp_path: Path) -> None:
    tree(tmp_path, *GPU_AND_CPU_FILES)
    deleted = layers.prune_gpu_only(tmp_path, {"PATH": "/usr/bin", "GPU_LIBRARIES": "leave-out"})
    assert sorted(deleted) == [
        ("nvidia/cu13/lib/libcusolverMg.so.12", 10),
        ("nvidia/cu13/lib/libnvrtc.alt.so.13", 10),
        ("nvidia/cudnn/lib/libcudnn_ops.so.9", 10),
        ("triton/_C/libtriton.so", 10),
        ("triton/backends/nvidia/bin", 10),
        ("triton/backends/nvidia/lib", 10),
    ]
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(
        {*GPU_AND_CPU_FILES}
        - {f for f, _ in deleted}
        - {"triton/backends/nvidia/bin/ptxas", "triton/backends/nvidia/lib/cupti/libcupti.so"}
    )
    # a later layer finds nothing more to delete
    assert layers.prune_gpu_only(tmp_path, {"GPU_LIBRARIES": "leave-out"}) == []


@pytest.mark.parametrize("environ", [{}, {"GPU_LIBRARIES": "keep"}, {"GPU_LIBRARIES": ""}])
def test_otherwise_the_layers_keep_the_whole_stack(tmp_path: Path, environ: dict) -> None:
    tree(tmp_path, *GPU_AND_CPU_FILES)
    assert layers.prune_gpu_only(tmp_path, environ) == []
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == len(GPU_AND_CPU_FILES)


def gpu_libraries(*gpus: object) -> str:
    """The trainer_image role's GPU_LIBRARIES for trainers with these `gpus` (None: unset),
    rendered from its vars/main.yml by Ansible's own templating."""
    hostvars = {
        f"node{n}": {} if value is None else {"gpus": value} for n, value in enumerate(gpus)
    }
    variables = {
        "_trainer_image_gpu_libraries": trust_as_template(
            ROLE_VARS["_trainer_image_gpu_libraries"]
        ),
        "groups": {"trainers": list(hostvars)},
        "hostvars": hostvars,
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    text = ROLE_VARS["_trainer_image_build_args"]["GPU_LIBRARIES"]
    return templar.template(trust_as_template(text))


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ((0, 0, 0), "leave-out"),  # the sandbox's inventory
        ((0, "0"), "leave-out"),
        ((8, 8, 8), "keep"),  # the sample inventory
        ((0, 0, 1), "keep"),
        ((0, None), "keep"),  # unset: train.yml detects the host's GPUs
        ((None,), "keep"),
    ],
)
def test_the_role_leaves_gpu_libraries_out_only_where_no_trainer_has_a_gpu(
    gpus: tuple, expected: str
) -> None:
    assert gpu_libraries(*gpus) == expected


def test_the_dockerfile_declares_the_role_s_build_arguments_in_its_final_stage() -> None:
    """A build argument the final stage does not declare would reach no RUN step."""
    dockerfile = (ROOT / "images/trainer/Dockerfile").read_text()
    final = dockerfile[dockerfile.rindex("\nFROM ") :]
    declared = {
        line.split()[1].split("=")[0] for line in final.splitlines() if line.startswith("ARG ")
    }
    assert set(ROLE_VARS["_trainer_image_build_args"]) - {"BASE_IMAGE"} <= declared


def test_a_bad_step_is_refused_with_its_usage() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "images/trainer/layers.py"), "install", "9"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"usage: layers.py plan | install N (N = 1 .. {layers.LAYERS})"
