"""Where the generated files and their sources live: paths are from the repository root."""

from __future__ import annotations

from pathlib import Path

# deploy/generators/paths.py: two levels below the root, wherever the command runs from.
ROOT = Path(__file__).resolve().parents[2]
