"""What a read of `jaxmon.step` costs now that jaxmon's public names are plain module attributes (bound at the first
read of one, the hook dropped), beside the same read from a module that keeps a module `__getattr__` (PEP 562), as
jaxmon did before, in one run.

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


def _unknown(name: str) -> object:
    raise AttributeError(name)


def main() -> None:
    hooked = types.ModuleType("hooked")
    hooked.step = jaxmon.step  # binds jaxmon's names too (the first read of one)
    hooked.__getattr__ = _unknown  # type: ignore[attr-defined]  # a module __getattr__, as jaxmon had
    assert "step" in vars(jaxmon) and "__getattr__" not in vars(jaxmon)
    rounds = [(_per_read(jaxmon), _per_read(hooked)) for _ in range(3)]  # alternated, side by side
    for plain, slow in rounds:
        diff = (slow - plain) * 1e9
        print(f"jaxmon.step {plain * 1e9:5.1f} ns   with __getattr__ {slow * 1e9:5.1f} ns   difference {diff:4.1f} ns")


if __name__ == "__main__":
    main()
