"""`jaxmon top`: a live view of one or more running jaxmon endpoints in the terminal (or one frame with --once)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """`jaxmon top ARGS`; without rich (the `top` extra) a one-line error saying what to install."""
    try:
        from jaxmon.top.cli import main as top
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "rich":
            raise
        print("jaxmon top needs rich: pip install 'jaxmon[top]' (the container images have it)", file=sys.stderr)
        return 2
    return top(argv)


__all__ = ["main"]
