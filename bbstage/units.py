"""Sizes with binary units (``512M``, ``10G``): one parser for the config, the S3 settings and
``bbstage bench``. It imports nothing of bbstage, so the S3 settings need not import config
(which checks them: that was a circle)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def parse_size(text: str | int) -> int:
    """``"10G"`` → bytes (binary units, optional ``B``/``iB`` suffix)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 10G)")
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([KMGTP]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 10G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]
