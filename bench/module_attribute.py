"""What a read of `jaxmon.step` costs with jaxmon's lazy re-exports (a module `__getattr__` that binds each name at
its first read, and stays), beside the same read from a module without one, in one run.

    .venv/bin/python bench/module_attribute.py

CPython specializes attribute reads of a module only where the module has no `__getattr__`; the rest go the generic
way. Each figure is the best of 7 repeats of 2,000,000 reads in a loop, less the same loop reading a local.
"""

from __future__ import annotations

import timeit
import types

import jaxmon

N, REPEAT = 2_000_000, 7


def _per_read(module: types.ModuleType) -> float:
    def reads() -> None:
        m = module
        for _ in range(N):
            m.step  # noqa: B018 - the read is what is measured

    def floor() -> None:
        m = module
        for _ in range(N):
            m  # noqa: B018

    return (min(timeit.repeat(reads, number=1, repeat=REPEAT)) - min(timeit.repeat(floor, number=1, repeat=REPEAT))) / N


def main() -> None:
    plain = types.ModuleType("plain")
    plain.step = jaxmon.step  # binds jaxmon.step too (its first read)
    assert "step" in vars(jaxmon) and "__getattr__" in vars(jaxmon)
    rounds = [(_per_read(jaxmon), _per_read(plain)) for _ in range(3)]  # alternated, side by side
    for hooked, bare in rounds:
        diff = (hooked - bare) * 1e9
        print(f"jaxmon.step {hooked * 1e9:5.1f} ns   plain module {bare * 1e9:5.1f} ns   difference {diff:4.1f} ns")


if __name__ == "__main__":
    main()
