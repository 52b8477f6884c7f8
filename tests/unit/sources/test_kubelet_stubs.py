"""The committed kubelet stubs: what protoc makes of api.proto today, loadable with no compiler installed.

protoc (grpcio-tools, a test dependency only) regenerates them here from api.proto; the API they describe, every
message, field and RPC, must be the committed files' (the text differs between protoc versions, the descriptor
does not). The committed code must load with the runtime this environment has, and carry no runtime version check
(protoc 26 and later write one that refuses older runtimes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from jaxmon.sources.kubelet import stubs

HERE = Path(stubs.__file__).parent
ROOT = HERE.parents[2]


def _generated(tmp_path: Path) -> None:
    """protoc (grpcio-tools, in this process) on api.proto, as the committed files were made."""
    from grpc_tools import protoc

    relative = stubs.PROTO.relative_to(ROOT)
    include = Path(protoc.__file__).parent / "_proto"  # protoc's well-known types, as `python -m grpc_tools.protoc`
    status = protoc.main(["protoc", f"--proto_path={ROOT}", f"--proto_path={include}", f"--python_out={tmp_path}",
                          f"--grpc_python_out={tmp_path}", f"--descriptor_set_out={tmp_path / 'api.pb'}",
                          str(relative)])  # fmt: skip
    assert status == 0


def test_the_committed_stubs_describe_what_protoc_makes_of_api_proto(tmp_path: Path) -> None:
    _generated(tmp_path)
    regenerated = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "api.pb").read_bytes()).file[0]
    for message in regenerated.message_type:  # a descriptor set names each field's JSON name; embedded code does not
        for field in message.field:
            field.ClearField("json_name")
    pb, _ = stubs.stubs()
    committed = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert committed == regenerated, "api_pb2.py is not api.proto's: regenerate it (stubs.py says how)"
    assert [m.name for m in committed.service[0].method] == ["List", "GetAllocatableResources", "Get"]


class _Channel:
    """Records the methods a stub registers."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def unary_unary(self, path: str, *args: Any, **kwargs: Any) -> None:
        self.paths.append(path)


def test_the_committed_grpc_stub_calls_every_method_of_the_service() -> None:
    pb, pb_grpc = stubs.stubs()
    channel = _Channel()
    pb_grpc.PodResourcesListerStub(channel)
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert channel.paths == [f"/{service.full_name}/{m.name}" for m in service.methods]


@pytest.mark.parametrize("name", ["api_pb2.py", "api_pb2_grpc.py"])
def test_the_committed_stubs_check_no_runtime_version(name: str) -> None:
    text = (HERE / name).read_text(encoding="utf-8")
    assert "DO NOT EDIT" in text  # protoc's output, as it wrote it
    assert "ValidateProtobufRuntimeVersion" not in text and "GRPC_GENERATED_VERSION" not in text


@pytest.mark.parametrize("name", ["stubs.py", "api_pb2.py", "api_pb2_grpc.py", "__init__.py"])
def test_nothing_at_run_time_needs_the_compiler(name: str) -> None:
    """grpcio-tools is a test dependency only (tests/e2e/test_daemon_kubernetes.py checks the daemon never maps it)."""
    assert "grpc_tools" not in (HERE / name).read_text(encoding="utf-8").split('"""', 2)[-1]
