"""A real Prometheus for the end-to-end tests: the Debian `prometheus` binary on loopback, its HTTP API, stopped at
the end of the test (tests/e2e/test_prometheus.py, tests/e2e/test_job_view.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.helpers import die_with_parent, free_port, terminate, wait_until


class LoopbackServer:
    """A Prometheus-project server (Prometheus, Alertmanager) as a child on a free loopback port: its YAML config and
    log in `tmp`, ready when its /-/ready answers 200."""

    name = "server"

    def __init__(self, tmp: Path, config: dict[str, Any], binary: str, args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config_path = tmp / f"{self.name}.yml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log_path = tmp / f"{self.name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        argv = [binary, f"--config.file={config_path}", f"--web.listen-address=127.0.0.1:{self.port}", *args]
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=tmp, preexec_fn=die_with_parent
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.log()}"
            try:
                return requests.get(self.url + "/-/ready", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(ready, timeout, f"{self.name} ready", step=0.1, detail=self.log)

    def stop(self) -> None:
        try:
            terminate(self.proc)
        finally:
            self._log.close()


class Prometheus(LoopbackServer):
    """The Debian `prometheus` binary on loopback with a temporary data directory."""

    name = "prometheus"

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise AssertionError("prometheus not found: install the Debian package 'prometheus' (tests/run.sh does)")
        args = [f"--storage.tsdb.path={tmp / 'tsdb'}", "--storage.tsdb.retention.time=1h", "--query.max-concurrency=4"]
        super().__init__(tmp, config, binary, [*args, "--log.level=warn"])

    def api(self, path: str, **params: Any) -> Any:
        r = requests.get(self.url + "/api/v1/" + path, params=params, timeout=20)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {body.get('errorType')}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; fails on a parse or evaluation error."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(
        self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool], what: str, timeout: float = 60.0
    ) -> None:
        result: list[dict[str, Any]] = []

        def holds() -> bool:
            result[:] = self.query(expr)
            return predicate(result)

        wait_until(holds, timeout, what, step=0.25, detail=lambda: f"{expr} gave {result}")
