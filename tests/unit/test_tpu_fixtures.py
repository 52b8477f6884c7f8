"""The real TPU v5e memory_stats() dicts (bench/tpu.sh on one Cloud TPU v5e chip, libtpu 0.0.42.1, JAX 0.10.2;
bench/results/tpu-runsc-20261205T232951Z), as tests/fixtures replay files:

- tpu-v5e-memory-stages.json: one device, five stages replayed in order (fresh; after 8 x 64 MiB arrays; after
  freeing every other one; after a program whose compiled memory_analysis() had 1,644,167,168 bytes of temporaries;
  after freeing everything);
- tpu-v5e-large-reservation.json: the fourth stage alone, a chip with XLA's program reservation.

The truth here is the chip's own: XLA reserves a program's temporaries from the top of HBM (bytes_reserved, exactly
the program's temp_size_in_bytes), and what is left for arrays is one block, the reservable limit less the
reservation. jaxmon's replay serves the dicts' fields unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import CLI, FIXTURES

STAGES = ["fresh", "after_arrays", "after_freeing_every_other", "after_large_temp_program", "after_freeing_everything"]
TEMP_SIZE_IN_BYTES = 1_644_167_168  # the program's compiled memory_analysis() (replay-stages.meta.json)
MIB = 1 << 20


def stages() -> list[dict[str, int]]:
    doc = json.loads((FIXTURES / "tpu-v5e-memory-stages.json").read_text())
    (device,) = doc["devices"]
    assert device["platform"] == "tpu" and device["device_kind"] == "TPU v5 lite"
    return list(device["memory_stats"])


def test_the_real_dicts_hold_what_the_chip_did_at_each_stage() -> None:
    fresh, arrays, half, program, freed = stages()
    limit = fresh["bytes_limit"]
    assert all(s["bytes_limit"] == limit == 16_909_336_064 for s in stages())
    # 8 arrays of 64 MiB, then 4 of them.
    assert 8 * 64 * MIB <= arrays["bytes_in_use"] - fresh["bytes_in_use"] < 8 * 64 * MIB + MIB  # and small buffers
    assert arrays["bytes_in_use"] - half["bytes_in_use"] == 4 * 64 * MIB
    # No program has run: nothing reserved, and the reservable limit is the whole limit.
    for s in (fresh, arrays, half):
        assert s["bytes_reserved"] == 0 and s["bytes_reservable_limit"] == limit
    # The program reserved exactly its temporaries, and what is free for arrays is one block under them.
    assert program["bytes_reserved"] == program["peak_bytes_reserved"] == TEMP_SIZE_IN_BYTES
    assert program["largest_free_block_bytes"] == program["bytes_reservable_limit"] - program["bytes_reserved"]
    assert program["bytes_reservable_limit"] < limit
    # Freed: the reservation went with the program's executable; its peak stays.
    assert freed["bytes_reserved"] == 0 and freed["peak_bytes_reserved"] == TEMP_SIZE_IN_BYTES
    assert freed["bytes_in_use"] == fresh["bytes_in_use"]
    assert freed["largest_free_block_bytes"] == fresh["largest_free_block_bytes"] == limit - fresh["bytes_in_use"]


def test_the_large_reservation_fixture_is_that_stage() -> None:
    doc = json.loads((FIXTURES / "tpu-v5e-large-reservation.json").read_text())
    assert doc["devices"][0]["memory_stats"] == stages()[STAGES.index("after_large_temp_program")]


def test_jaxmon_serves_the_real_dicts_fields_unchanged(cli: CLI) -> None:
    for name, want in (
        ("tpu-v5e-memory-stages.json", stages()[0]),  # a list replays its first entry first
        ("tpu-v5e-large-reservation.json", stages()[3]),
    ):
        code, out, err = cli("snapshot", "--replay", str(FIXTURES / name), "--json")
        assert code == 0, err
        (device,) = json.loads(out)["devices"]
        memory: dict[str, Any] = device["memory"]
        assert memory["supported"] is True
        assert memory["bytes_in_use"] == want["bytes_in_use"]
        assert memory["limit_bytes"] == want["bytes_limit"]
        assert memory["largest_free_block_bytes"] == want["largest_free_block_bytes"]
        assert memory["peak_bytes_in_use"] == want["peak_bytes_in_use"]
        assert memory["allocations_total"] == want["num_allocs"]


def test_free_memory_and_fragmentation_on_the_real_chip_leave_the_reservation_out() -> None:
    """What a new array can get is the limit less the arrays less XLA's reservation, and the chip's own largest free
    block says how much of that is one block: with no holes (fresh, after whole arrays, freed) it is all of it (0
    fragmentation, but for the 2 KiB of alignment after the arrays); with every other array freed the holes below the
    arrays' high mark are the fragmentation, the same with the program's reservation on top (it is not)."""
    from jaxmon.allocator import memory_numbers

    fresh, arrays, half, program, freed = stages()
    for s in stages():
        numbers = memory_numbers(s)
        assert numbers.free_bytes == s["bytes_limit"] - s["bytes_in_use"] - s["bytes_reserved"]
        assert numbers.reserved_bytes == s["bytes_reserved"]
        assert numbers.fragmentation_ratio is not None and numbers.free_bytes
        assert abs(numbers.fragmentation_ratio - (1 - s["largest_free_block_bytes"] / numbers.free_bytes)) < 1e-12
    assert memory_numbers(fresh).fragmentation_ratio == memory_numbers(freed).fragmentation_ratio == 0
    assert (memory_numbers(arrays).fragmentation_ratio or 0) < 1e-6
    # The holes: 4 x 64 MiB freed below the high mark, whether or not the program's reservation sits above them.
    holes = 4 * 64 * MIB
    for s in (half, program):
        assert (
            abs((memory_numbers(s).free_bytes or 0) - s["largest_free_block_bytes"] - holes) <= 4 * MIB
        )  # small buffers
    # The reservation is not read as fragmentation: without it the same chip would read over 10 % fragmented.
    old = 1 - program["largest_free_block_bytes"] / (program["bytes_limit"] - program["bytes_in_use"])
    assert old > 0.1 and (memory_numbers(program).fragmentation_ratio or 1) < 0.02
