"""Whether a dashboard query's series are bounded whatever the size of the fleet: a static reading of its PromQL.

A query is bounded when its result cannot grow with the number of devices or processes: `topk($k, …)` and
`bottomk($k, …)`; an aggregation (`sum`, `avg`, `max`, `min`, `count`, `quantile`, …) with no `by`, or `by` labels
none of which names a device or a process; a series recorded once per job; a constant. Functions (rate, increase,
histogram_quantile, time() - x, …) keep their argument's bound. Of a binary operation: `and` is bounded when either
side is (the result is a subset of each), `unless` when its left side is, `or` when both are, an arithmetic or
comparison operation one-to-one when either side is, with group_left when the left side is (group_right: the
right). A plain selector of a per-device or per-process family is unbounded.

tests/unit/test_deploy.py holds every panel query of every dashboard to this; tests/e2e/test_prometheus.py evaluates
them with a small $k on more devices than that, and counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Labels with one value per device or per process (or finer): grouping by any of them is not an aggregate.
PER_ENTITY = frozenset(
    {
        "device",
        "process_index",
        "instance",
        "pid",
        "pod",
        "host",
        "node",
        "uuid",
        "mig_uuid",
        "gpu_instance",
        "compute_instance",
        "container",
        "device_id",
        "link",
        "fan",
        "pci_bus_id",
        "coords",
    }
)
# Recorded series of one value per job (workload) or a constant: bounded by the number of jobs, not of devices
# (the badput shares: one per job and kind, the built-in kinds and at most ten of the user's).
PER_JOB = re.compile(
    r"^jaxmon:(param:.*|.*:job_median5m|workload_energy_joules_per_step:rate5m|training_goodput_ratio:rate5m"
    r"|training_badput_ratio:rate5m|training_(tokens|examples)_per_second:rate1m)$"
)
AGGREGATIONS = {"sum", "avg", "max", "min", "count", "quantile", "stddev", "stdvar", "group", "count_values"}
SELECTING = {"topk", "bottomk"}
# Functions whose result has the series of this argument (0-based); the others are constants.
PASS_THROUGH = {
    "rate": 0,
    "irate": 0,
    "increase": 0,
    "delta": 0,
    "deriv": 0,
    "abs": 0,
    "clamp": 0,
    "clamp_min": 0,
    "clamp_max": 0,
    "round": 0,
    "histogram_quantile": 1,
    "label_replace": 0,
    "sort": 0,
    "sort_desc": 0,
    "max_over_time": 0,
    "min_over_time": 0,
    "avg_over_time": 0,
    "last_over_time": 0,
    "changes": 0,
    "resets": 0,
    "timestamp": 0,
}
CONSTANTS = {"vector", "time", "scalar"}
PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    "==": 3,
    "!=": 3,
    ">": 3,
    "<": 3,
    ">=": 3,
    "<=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "^": 6,
}
TOKEN = re.compile(
    r"""\s*(?:
    (?P<selector>\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})
    |(?P<range>\[[^\]]*\])
    |(?P<string>"(?:[^"\\]|\\.)*")
    |(?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)
    |(?P<name>[$a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<op>==|!=|>=|<=|[-+*/%^<>(),])
    )""",
    re.VERBOSE,
)


@dataclass
class Bound:
    """A sub-expression: bounded (or why not), and whether it is a scalar or constant."""

    bounded: bool
    constant: bool = False
    why: str = ""


class Parser:
    def __init__(self, expr: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        expr = expr.strip()
        while pos < len(expr):
            m = TOKEN.match(expr, pos)
            if not m or m.end() == pos:
                raise ValueError(f"cannot read {expr[pos:]!r} in {expr!r}")
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> str:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else ""

    def take(self, want: str | None = None) -> str:
        value = self.peek()
        if want is not None and value != want:
            raise ValueError(f"expected {want!r}, got {value!r}")
        self.i += 1
        return value

    def labels(self) -> list[str]:
        self.take("(")
        out = []
        while self.peek() != ")":
            out.append(self.take())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return out

    def expression(self, min_precedence: int = 0) -> Bound:
        left = self.unary()
        while self.peek() in PRECEDENCE and PRECEDENCE[self.peek()] > min_precedence:
            op = self.take()
            group = ""
            if self.peek() == "bool":
                self.take()
            if self.peek() in ("on", "ignoring"):
                self.take()
                self.labels()
            if self.peek() in ("group_left", "group_right"):
                group = self.take()
                if self.peek() == "(":
                    self.labels()
            # ^ is right-associative; the rest left.
            right = self.expression(PRECEDENCE[op] - (1 if op == "^" else 0))
            left = combine(op, group, left, right)
        return left

    def unary(self) -> Bound:
        if self.peek() in ("-", "+"):
            self.take()
        return self.primary()

    def primary(self) -> Bound:
        kind, value = self.tokens[self.i]
        if value == "(":
            self.take()
            inner = self.expression()
            self.take(")")
            return inner
        if kind == "number":
            self.take()
            return Bound(True, constant=True)
        if kind == "selector":
            self.take()
            return self.suffixes(Bound(False, why=f"selector {value}"))
        if kind != "name":
            raise ValueError(f"unexpected {value!r}")
        self.take()
        if value in AGGREGATIONS | SELECTING:
            return self.aggregation(value)
        if self.peek() == "(":
            return self.function(value)
        selector = self.take() if self.tokens[self.i : self.i + 1] and self.tokens[self.i][0] == "selector" else ""
        if PER_JOB.match(value):
            return self.suffixes(Bound(True))
        return self.suffixes(Bound(False, why=f"per-device or per-process {value}{selector}"))

    def suffixes(self, bound: Bound) -> Bound:
        if self.i < len(self.tokens) and self.tokens[self.i][0] == "range":
            self.take()
        if self.peek() == "offset":
            self.take()
            self.take()
        return bound

    def arguments(self) -> list[Bound | str]:
        self.take("(")
        args: list[Bound | str] = []
        while self.peek() != ")":
            if self.tokens[self.i][1] == "$k" or self.tokens[self.i][0] == "string":
                args.append(self.take())
            else:
                args.append(self.expression())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return args

    def function(self, name: str) -> Bound:
        args = self.arguments()
        if name in CONSTANTS:
            return Bound(True, constant=True)
        if name not in PASS_THROUGH:
            raise ValueError(f"unknown function {name}")
        arg = args[PASS_THROUGH[name]]
        assert isinstance(arg, Bound)
        return arg

    def aggregation(self, name: str) -> Bound:
        grouping: tuple[str, list[str]] | None = None
        if self.peek() in ("by", "without"):
            grouping = (self.take(), self.labels())
        args = self.arguments()
        if self.peek() in ("by", "without"):
            grouping = (self.take(), self.labels())
        inner = args[-1]
        assert isinstance(inner, Bound)
        if name in SELECTING:
            if args[0] != "$k":
                return Bound(False, why=f"{name} of a fixed count, not $k")
            if grouping is not None:
                return Bound(False, why=f"{name} {grouping[0]} ({', '.join(grouping[1])}): $k per group")
            return Bound(True)
        if grouping is None or inner.constant:
            return Bound(True)
        how, labels = grouping
        if how == "without":
            return Bound(False, why=f"{name} without ({', '.join(labels)})")
        per = sorted(PER_ENTITY & set(labels))
        if per:
            return Bound(inner.bounded, why=f"{name} by ({', '.join(labels)}): per {', '.join(per)}")
        return Bound(True)


def combine(op: str, group: str, left: Bound, right: Bound) -> Bound:
    if left.constant and right.constant:
        return Bound(True, constant=True)
    if left.constant or right.constant:
        return right if left.constant else left
    if op == "and":
        return left if left.bounded else right
    if op == "unless":
        return left
    if op == "or":
        return left if not left.bounded else right
    if group == "group_left":
        return left
    if group == "group_right":
        return right
    return left if left.bounded else right


def unbounded(expr: str) -> str:
    """Why `expr` can return a series per device or per process ("" when it cannot)."""
    parser = Parser(expr)
    bound = parser.expression()
    if parser.i != len(parser.tokens):
        raise ValueError(f"trailing {parser.tokens[parser.i :]} in {expr!r}")
    return "" if bound.bounded else bound.why or "unbounded"
