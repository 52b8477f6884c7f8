"""What the fakes that run as child processes share (tests/fake_kubelet.py, tests/fake_apiserver.py): a directory
of their own, a scenario file the test writes atomically and the child re-reads at every call, the child's log,
and its start (until it says it is ready), stop and clean-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, terminate, wait_until


class ScenarioChild:
    """A fake as a child process (`python -m <module> <args>`) answering `scenario`; it writes `<dir>/ready` once it
    listens. `what` names it in the start's timeout."""

    module = ""
    what = ""

    def __init__(self, prefix: str, scenario: dict[str, Any]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.scenario_path = self.dir / "scenario.json"
        self.scenario = scenario
        self._write()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / f"{self.module.rpartition('.')[2].replace('_', '-')}.log"

    def _write(self) -> None:
        tmp = self.scenario_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.scenario), encoding="utf-8")
        os.replace(tmp, self.scenario_path)

    def update(self, **changes: Any) -> None:
        """Change the scenario; the child's next call answers it."""
        self.scenario.update(changes)
        self._write()

    def call_lines(self) -> list[str]:
        """The lines the child appended to `<scenario>.calls`, one a call, in order."""
        path = self.scenario_path.with_suffix(".calls")
        return path.read_text().splitlines() if path.exists() else []

    def args(self) -> list[str]:
        """The child's command-line arguments after the module."""
        raise NotImplementedError

    def listening(self) -> bool:
        return (self.dir / "ready").exists()

    def _start(self) -> None:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args()], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(self.listening, timeout=30, what=f"{self.what} listening", detail=self.log_path.read_text)

    def stop(self) -> None:
        """End the process."""
        if self.proc is not None:
            terminate(self.proc)
        self.proc = None
        (self.dir / "ready").unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()
        for path in sorted(self.dir.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        self.dir.rmdir()
