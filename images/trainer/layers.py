"""Install the image's Python stack straight into its venv, one image layer per call.

The stack is ~5.8 GB installed. As one layer, every trainer would fetch and unpack it on one
core per pull, and any change to it would move all of it; a builder stage copied into the final
stage writes it twice. So the Dockerfile installs it in place, in a few RUN steps of similar
size (the layers of a pull go side by side), each one:

    python layers.py plan             # resolve requirements.txt once: what pip would install
    python layers.py install N        # install layer N's share of that (N = 1 .. LAYERS)

``plan`` writes plan.json beside this file: name and version of every package, resolved by pip
from requirements.txt (the image's pins) and the package source: the wheelhouse served to the
build at ``WHEELHOUSE_URL`` (pip gets ``--no-index --find-links``), or, where that is empty, the
package index pip is configured for. Each ``install`` installs its share
with ``--no-deps`` at exactly those versions, then byte-compiles what it added on every core
(``compile_new``); the last one installs what no group names and checks the whole stack with
``pip check``. Standard library only: it runs on the base's Python.

With ``GPU_LIBRARIES=leave-out`` (a build argument: the trainer_image role passes it where
every trainer's inventory says ``gpus: 0``, as in the sandbox) each layer then deletes the files
of its packages that only a GPU ever loads (``GPU_ONLY``): torch's CUDA 13 wheels are the only
build that pip can pair with torchvision on the development machines, and without a GPU their
cuDNN engines, Triton's GPU compiler and a few CUDA libraries are ~1.9 of the stack's ~5.8 GB,
which every trainer pulls. What torch links at import stays, so the stack imports as before.
"""

from __future__ import annotations

import compileall
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLAN = HERE / "plan.json"
REQUIREMENTS = HERE / "requirements.txt"

# The biggest packages of torch's CUDA 13 stack, grouped by their wheel sizes (MB) measured
# for torch 2.14.1: cudnn 553, torch 555, cublas 423 + cusparse 146, triton 248 + nccl 216 +
# nvshmem 60, cufft 214 + cusolver 201. Names are without their -cuNN suffix. Whatever no
# group names (cusparselt, nvrtc, curand, nvjitlink, numpy, pillow, torchvision, ...) goes into
# the last layer, so a renamed or new dependency still installs, only less evenly spread.
GROUPS: tuple[frozenset[str], ...] = (
    frozenset({"nvidia-cudnn"}),
    frozenset({"torch"}),
    frozenset({"nvidia-cublas", "nvidia-cusparse"}),
    frozenset({"triton", "nvidia-nccl", "nvidia-nvshmem"}),
    frozenset({"nvidia-cufft", "nvidia-cusolver"}),
)
LAYERS = len(GROUPS) + 1

# Files of the CUDA stack that a CPU-only host never loads, as globs under site-packages
# (torch 2.14.1, cuDNN 9, Triton 3; measured with /proc/self/maps after importing torch and
# torchvision, a bf16 DDP step over gloo, decode_jpeg, and a CPU torch.compile, 2026-12-07):
# - cuDNN's sub-libraries, which libcudnn.so.9 opens on first use (~800 MB). libcudnn_graph
#   stays: cudnnGetVersion, which versions.py calls, opens it, and without it the process ends.
# - Triton's compiler library and its NVIDIA backend's bundled CUDA tools and libraries
#   (~870 MB): torch imports Triton only to compile GPU kernels, and where ``import triton``
#   fails it uses its C++ code generation on CPU, as without the package.
# - cuSOLVER's multi-GPU library and NVRTC's alternative build (~200 MB), which torch never
#   links.
GPU_ONLY: tuple[str, ...] = (
    "nvidia/cudnn/lib/libcudnn_adv.so.*",
    "nvidia/cudnn/lib/libcudnn_cnn.so.*",
    "nvidia/cudnn/lib/libcudnn_engines_precompiled.so.*",
    "nvidia/cudnn/lib/libcudnn_engines_runtime_compiled.so.*",
    "nvidia/cudnn/lib/libcudnn_engines_tensor_ir.so.*",
    "nvidia/cudnn/lib/libcudnn_ext.so.*",
    "nvidia/cudnn/lib/libcudnn_heuristic.so.*",
    "nvidia/cudnn/lib/libcudnn_ops.so.*",
    "triton/_C/libtriton.so",
    "triton/_C/libproton.so",
    "triton/backends/nvidia/bin",
    "triton/backends/nvidia/lib",
    "nvidia/*/lib/libcusolverMg.so.*",
    "nvidia/*/lib/libnvrtc.alt.so.*",
)


def group_key(name: str) -> str:
    """A project name as the groups spell it: normalised, without a -cuNN suffix."""
    normal = re.sub(r"[-_.]+", "-", name).lower()
    return re.sub(r"-cu\d+$", "", normal)


def layer_of(name: str) -> int:
    """The layer (1-based) that installs the package ``name``."""
    key = group_key(name)
    for number, group in enumerate(GROUPS, start=1):
        if key in group:
            return number
    return LAYERS


def pip_install(*args: str) -> None:
    """``pip install`` from the package source the build was given (see the module's docstring)."""
    url = os.environ.get("WHEELHOUSE_URL", "")
    source = ["--no-index", "--find-links", url] if url else []
    subprocess.run([sys.executable, "-m", "pip", "install", *source, *args], check=True)


def plan() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        pip_install(
            "--dry-run",
            "--quiet",
            "--report",
            str(report),
            "--requirement",
            str(REQUIREMENTS),
        )
        chosen = json.loads(report.read_text())["install"]
    pins = sorted(f"{item['metadata']['name']}=={item['metadata']['version']}" for item in chosen)
    PLAN.write_text(json.dumps(pins, indent=1) + "\n")


def compile_new() -> None:
    """Byte-compile the venv's modules that have no current .pyc, on every core. pip compiles
    one file at a time: on a 2-core host, 58 s of the torch stack's 90 s install, against 15 s
    here (2026-12-01); the image runs with PYTHONDONTWRITEBYTECODE, so its .pyc are made now or
    never. An earlier layer's files keep theirs and are only read (a rewrite would copy them
    into this layer); files that are not Python 3 (templates, test data) stay without one, as
    pip leaves them."""
    paths = sysconfig.get_paths()
    for directory in sorted({paths["purelib"], paths["platlib"]}):
        compileall.compile_dir(directory, quiet=2, workers=0)


def prune_gpu_only(site: Path, environ: Mapping[str, str]) -> list[tuple[str, int]]:
    """With ``GPU_LIBRARIES=leave-out`` in ``environ``, delete what of ``GPU_ONLY`` is under
    ``site``; the paths deleted (relative to ``site``) and their bytes. Anything else keeps all."""
    if environ.get("GPU_LIBRARIES") != "leave-out":
        return []
    deleted = []
    for pattern in GPU_ONLY:
        for found in sorted(glob.glob(pattern, root_dir=site)):
            path = site / found
            if path.is_dir() and not path.is_symlink():
                size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                shutil.rmtree(path)
            else:
                size = path.lstat().st_size
                path.unlink()
            deleted.append((found, size))
    return deleted


def install(layer: int) -> None:
    pins = [pin for pin in json.loads(PLAN.read_text()) if layer_of(pin.split("==")[0]) == layer]
    if pins:
        pip_install("--no-deps", "--no-compile", *pins)
        compile_new()
        for found, size in prune_gpu_only(Path(sysconfig.get_paths()["platlib"]), os.environ):
            print(f"layers.py: no GPU on any trainer, left out {found} ({size / 2**20:.0f} MiB)")
    if layer == LAYERS:
        subprocess.run([sys.executable, "-m", "pip", "check"], check=True)


def main(argv: list[str]) -> int:
    if argv == ["plan"]:
        plan()
        return 0
    layers = [str(number) for number in range(1, LAYERS + 1)]
    if len(argv) == 2 and argv[0] == "install" and argv[1] in layers:
        install(int(argv[1]))
        return 0
    print(f"usage: layers.py plan | install N (N = 1 .. {LAYERS})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
