"""`jaxmon.cli.main(argv)` in-process where it binds a real socket: a port already taken.

The cases that end before the daemon would serve are in tests/unit/test_cli.py.
"""

from __future__ import annotations

import socket

import pytest

from tests.conftest import CLI, FIXTURES

REPLAY = ["--replay", str(FIXTURES / "shapes.json")]


pytestmark = pytest.mark.usefixtures("no_jaxmon_env")


def test_a_port_in_use_exits_1_naming_the_address(cli: CLI) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        code, _, err = cli("serve", *REPLAY, "--web.listen-address", address)
    assert code == 1
    assert f"jaxmon serve: cannot listen on {address}: " in err
