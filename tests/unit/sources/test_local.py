"""The JAX boundary: the sidecar's GPU environment defaults and live-array accounting."""

from __future__ import annotations

import os

from jaxmon.sources.local import FRACTION_VARS, PREALLOCATE_VAR, apply_gpu_env_defaults

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")


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

    from jaxmon.sources.local import live_array_bytes

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
