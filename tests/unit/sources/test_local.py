"""The JAX boundary (jaxmon/sources/local.py): the sidecar's GPU environment defaults, live-array accounting, and
the probe kernel's buffers on the device it was made for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from jaxmon.device_readings import DeviceInfo
from jaxmon.sources.local import FRACTION_VARS, PREALLOCATE_VAR, LocalSource, apply_gpu_env_defaults
from tests.unit.conftest import pick

SIZE = 64
PROBE_DEVICE = 5  # not the default device 0, so implicit placement would show


def test_a_sidecar_does_not_preallocate_and_takes_a_small_fraction() -> None:
    env: dict[str, str] = {}
    applied = apply_gpu_env_defaults(env, 0.02)
    assert env == {PREALLOCATE_VAR: "false", "XLA_CLIENT_MEM_FRACTION": "0.02"}
    assert applied == env


def test_user_settings_win_and_only_one_fraction_name_is_ever_set() -> None:
    # Setting both fraction names makes JAX raise (DESIGN.md section 3).
    for name in FRACTION_VARS:
        env = {PREALLOCATE_VAR: "true", name: "0.5"}
        assert apply_gpu_env_defaults(env, 0.02) == {}
        assert env == {PREALLOCATE_VAR: "true", name: "0.5"}


def test_live_array_bytes_count_each_shard_once_on_its_own_device() -> None:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxmon.sources.local.workload import live_array_bytes

    devices = jax.devices()
    before = live_array_bytes(jax)
    mesh = Mesh(np.array(devices), ("d",))
    sharded = jax.device_put(np.ones(8 * 1024, np.float32), NamedSharding(mesh, PartitionSpec("d")))  # 4 KiB each
    replicated = jax.device_put(np.ones(256, np.float32), NamedSharding(mesh, PartitionSpec()))  # 1 KiB on each
    single = jax.device_put(np.ones(1000, np.float32), devices[3])
    alias = single  # the same buffer twice is still one buffer
    after = live_array_bytes(jax)
    for i, d in enumerate(devices):
        key = (d.platform, d.id)
        expected = 4096 + 1024 + (4000 if i == 3 else 0)
        assert after.get(key, 0) - before.get(key, 0) == expected, key
    del sharded, replicated, single, alias


def test_the_real_kernel_places_its_buffers_on_the_requested_device(
    local: tuple[LocalSource, list[DeviceInfo]],
) -> None:
    """Every array the kernel keeps alive lives on the device it was made for, not on the default device."""
    import jax

    source, devices = local
    dev = pick(devices, PROBE_DEVICE)
    (target,) = [d for d in jax.devices("cpu") if d.id == PROBE_DEVICE]
    live_arrays = cast(Callable[[], list[Any]], jax.live_arrays)
    before = live_arrays()  # held, so no id is reused while we compare

    def new_arrays() -> list[Any]:
        return [a for a in live_arrays() if not any(a is b for b in before)]

    kernel = source.make_probe(dev, SIZE)
    made = new_arrays()
    # x and w: two n x n float32 matrices, committed to the target device.
    assert sorted((a.shape, str(a.dtype)) for a in made) == [((SIZE, SIZE), "float32")] * 2
    assert all(a.devices() == {target} for a in made)
    kernel.run(3)
    after_run = new_arrays()
    assert len(after_run) >= 2
    assert all(a.devices() == {target} for a in after_run)
    del kernel
