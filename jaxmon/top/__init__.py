"""`jaxmon top`: a live view of one or more running jaxmon endpoints in the terminal (or one frame with --once)."""

from __future__ import annotations

from jaxmon.top.cli import main

__all__ = ["main"]
