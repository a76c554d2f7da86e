"""Region decoding of JPEGs: the ctypes side of ``libddpfleet_jpeg`` (images/trainer/jpegcrop.c).

The training image builds the library into ``<venv>/lib`` (the Dockerfile's jpeg stage) and
``make venv`` does the same for the host's ``.venv``. ``REGION`` is the loaded decoder, or
None where the library is absent (another image, a venv made without a compiler): then the
CPU decode path decodes whole files, as before this module existed.

Every failure of the library (a corrupt or truncated file, a CMYK file, a region it cannot
serve) comes back as None, never as an exception: the caller then decodes the file the
whole-file way, which is also what judges a file bad.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import torch

LIBRARY = "libddpfleet_jpeg.so"
DEFAULT_PATH = Path(sys.prefix, "lib", LIBRARY)
_MESSAGE_LEN = 200
_INT = ctypes.c_int
_INT_P = ctypes.POINTER(ctypes.c_int)


class RegionDecoder:
    """One loaded ``libddpfleet_jpeg``."""

    def __init__(self, path: Path):
        self.path = path
        lib = ctypes.CDLL(str(path))
        self._size = lib.ddpfleet_jpeg_size
        self._size.argtypes = [
            ctypes.c_char_p,
            ctypes.c_ulong,
            _INT_P,
            _INT_P,
            ctypes.c_char_p,
            _INT,
        ]
        self._size.restype = _INT
        self._region = lib.ddpfleet_jpeg_decode_region
        self._region.argtypes = [
            ctypes.c_char_p,
            ctypes.c_ulong,
            _INT,
            _INT,
            _INT,
            _INT,
            _INT,
            ctypes.c_void_p,
            ctypes.c_ulong,
            _INT_P,
            _INT_P,
            ctypes.c_char_p,
            _INT,
        ]
        self._region.restype = _INT
        self.last_error = ""

    def size(self, data: bytes) -> tuple[int, int] | None:
        """(width, height) from the header, or None (see ``last_error``)."""
        w, h, msg = _INT(), _INT(), ctypes.create_string_buffer(_MESSAGE_LEN)
        if self._size(data, len(data), ctypes.byref(w), ctypes.byref(h), msg, _MESSAGE_LEN):
            self.last_error = msg.value.decode(errors="replace")
            return None
        return w.value, h.value

    def decode(
        self, data: bytes, scale: int, box: tuple[int, int, int, int], scaled_width: int
    ) -> tuple[torch.Tensor, int] | None:
        """Rows ``box[1]:box[3]`` of the image decoded at 1/``scale`` (1, 2, 4 or 8), holding at
        least columns ``box[0]:box[2]`` (scaled pixels; ``scaled_width`` is the scaled image's
        width, ceil(width / scale)): (uint8 HWC tensor, the column its first pixel is at), or
        None (see ``last_error``)."""
        left, top, right, bottom = box
        out = torch.empty((bottom - top) * scaled_width * 3, dtype=torch.uint8)
        got_left, got_width = _INT(), _INT()
        msg = ctypes.create_string_buffer(_MESSAGE_LEN)
        rc = self._region(
            data,
            len(data),
            scale,
            left,
            top,
            right,
            bottom,
            out.data_ptr(),
            out.numel(),
            ctypes.byref(got_left),
            ctypes.byref(got_width),
            msg,
            _MESSAGE_LEN,
        )
        if rc:
            self.last_error = msg.value.decode(errors="replace") or f"code {rc}"
            return None
        rows = out[: (bottom - top) * got_width.value * 3].view(bottom - top, got_width.value, 3)
        return rows, got_left.value


def load(path: Path = DEFAULT_PATH) -> RegionDecoder | None:
    """The decoder at ``path``, or None where there is no loadable library."""
    try:
        return RegionDecoder(path)
    except OSError:  # absent, or built for another platform
        return None


REGION = load()
