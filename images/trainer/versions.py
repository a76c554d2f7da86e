"""Print the training stack's versions: torch, CUDA, cuDNN, NCCL, torchvision, trainer (and
whether the RDMA userspace NCCL uses for InfiniBand is there, and the trainer's region JPEG
decoder).

Run at image build time (the build log records them) and on demand:
``docker run --rm IMAGE python /opt/ddpfleet/versions.py``. Exits non-zero if the stack
does not import. On a CPU-only base the CUDA-side values print as "unavailable".
"""

from __future__ import annotations

import ctypes.util
import importlib
import importlib.metadata
import sys


def _nccl_version(torch_module: object) -> str:
    try:
        version = torch_module.cuda.nccl.version()  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return "unavailable"
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def versions() -> dict[str, str]:
    """The versions of the stack, as printable strings."""
    # Imported here so that a broken stack gives one line (main), not a traceback.
    torch = importlib.import_module("torch")
    torchvision = importlib.import_module("torchvision")
    for package in ("trainer", "ddpfleet_agent", "ddpfleet_doctor"):
        importlib.import_module(package)  # proves the wheel installed each of its packages
    region = importlib.import_module("trainer.jpeg").REGION  # the Dockerfile's jpeg stage

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "trainer": importlib.metadata.version("ddpfleet-trainer"),
        "cuda (build)": str(torch.version.cuda or "unavailable"),
        "cudnn": str(cudnn or "unavailable"),
        "nccl": _nccl_version(torch),
        "gpus visible": str(torch.cuda.device_count()),
        # NCCL loads it for InfiniBand/RoCE; CUDA images carry it, CPU (sandbox) ones need not
        "libibverbs": "present" if ctypes.util.find_library("ibverbs") else "absent",
        "jpeg regions": str(region.path) if region else "absent (whole-file decoding)",
    }


def main() -> int:
    try:
        found = versions()
    except ImportError as exc:
        print(f"versions: the training stack does not import: {exc}", file=sys.stderr)
        return 1
    for name, value in found.items():
        print(f"{name:>13}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
