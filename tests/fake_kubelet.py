"""A kubelet's pod-resources service (v1) on a unix socket, in a child process, answering what a test writes.

It speaks the real protocol: a `grpc.server` bound to `unix:<socket>`, with the servicer base class and messages
of jaxmon's own generated stubs (jaxmon.sources.kubelet.stubs, from api.proto). Every call re-reads the scenario
file the test writes (atomically), appends a line to `<scenario>.calls`, waits `delay_seconds` and answers
`status` (a grpc.StatusCode name) or the pods: each container's device-plugin devices (`devices`) and DRA claims
(`dynamic_resources`, as the kubelet fills them since Kubernetes 1.34), a container may hold both. Stopping the
process removes the socket, as a kubelet restart does; starting it again makes a new one at the same path.

    python -m tests.fake_kubelet SOCKET SCENARIO
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

from tests.fake_child import ScenarioChild


def pod(namespace: str, name: str, *containers: dict[str, Any]) -> dict[str, Any]:
    """A pod of the scenario: its containers (`container()`)."""
    return {"namespace": namespace, "name": name, "containers": list(containers)}


def container(
    name: str, devices: dict[str, list[str]] | None = None, claims: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A container holding the device ids of each resource in `devices` (`{"nvidia.com/gpu": ["GPU-..."]}`) and
    the devices of DRA `claims` (`claim()`)."""
    return {
        "name": name,
        "devices": [{"resource_name": resource, "device_ids": ids} for resource, ids in (devices or {}).items()],
        "dynamic_resources": list(claims or []),
    }


def claim(name: str, namespace: str, *devices: dict[str, Any]) -> dict[str, Any]:
    """A DRA claim as the kubelet reports it (DynamicResource): its name, namespace and devices (`claimed()`)."""
    return {"claim_name": name, "claim_namespace": namespace, "claim_resources": list(devices)}


def claimed(driver: str, pool: str, device: str, share_id: str | None = None) -> dict[str, Any]:
    """One ClaimResource, with the CDI device name the driver would give the runtime (`k8s.<driver>/claim=...`)."""
    out: dict[str, Any] = {
        "driver_name": driver,
        "pool_name": pool,
        "device_name": device,
        "cdi_devices": [{"name": f"k8s.{driver}/claim={device}"}],
    }
    if share_id is not None:
        out["share_id"] = share_id
    return out


class FakeKubelet(ScenarioChild):
    """The service as a child process; `socket` is in a short directory of its own (unix paths hold 107 bytes).
    `update()` changes pods, delay_seconds or status."""

    module = "tests.fake_kubelet"
    what = "the fake kubelet"

    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        super().__init__("kubelet-", {"pods": pods or [], "delay_seconds": 0, "status": None})
        (self.dir / "pod-resources").mkdir()
        self.socket = self.dir / "pod-resources" / "kubelet.sock"

    def calls(self) -> int:
        """List calls answered or begun so far."""
        return len(self.call_lines())

    def last_call(self) -> float:
        """Unix time the last List call began."""
        return float(self.call_lines()[-1])

    def args(self) -> list[str]:
        return [str(self.socket), str(self.scenario_path)]

    def listening(self) -> bool:
        return self.socket.exists() and super().listening()

    def start(self) -> FakeKubelet:
        self._start()
        return self

    def stop(self) -> None:
        """End the process; its socket goes with it."""
        super().stop()
        self.socket.unlink(missing_ok=True)


def _serve(socket: Path, scenario: Path) -> None:
    import grpc

    from jaxmon.sources.kubelet.stubs import stubs

    pb, pb_grpc = stubs()
    calls = scenario.with_suffix(".calls")

    class Servicer(pb_grpc.PodResourcesListerServicer):  # type: ignore[name-defined,misc]  # generated at run time
        def List(self, request: Any, context: Any) -> Any:
            data = json.loads(scenario.read_text(encoding="utf-8"))
            with open(calls, "a") as out:
                out.write(f"{time.time()}\n")
            if data.get("delay_seconds"):
                time.sleep(data["delay_seconds"])
            if data.get("status"):
                context.abort(getattr(grpc.StatusCode, data["status"]), f"fake kubelet answers {data['status']}")
            return pb.ListPodResourcesResponse(
                pod_resources=[
                    pb.PodResources(
                        name=p["name"],
                        namespace=p["namespace"],
                        containers=[
                            pb.ContainerResources(
                                name=c["name"],
                                devices=[pb.ContainerDevices(**d) for d in c["devices"]],
                                cpu_ids=[2, 3],
                                dynamic_resources=[
                                    pb.DynamicResource(
                                        claim_name=r["claim_name"],
                                        claim_namespace=r["claim_namespace"],
                                        claim_resources=[
                                            pb.ClaimResource(
                                                **{k: v for k, v in cr.items() if k != "cdi_devices"},
                                                cdi_devices=[pb.CDIDevice(**cdi) for cdi in cr["cdi_devices"]],
                                            )
                                            for cr in r["claim_resources"]
                                        ],
                                    )
                                    for r in c.get("dynamic_resources", [])
                                ],
                            )
                            for c in p["containers"]
                        ],
                    )
                    for p in data["pods"]
                ]
            )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_PodResourcesListerServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    (socket.parent.parent / "ready").write_text("")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    server.stop(grace=None).wait()
    socket.unlink(missing_ok=True)


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), Path(sys.argv[2]))
