"""The attribute spellings of HLO collectives: the bytes of a shape and the device groups of `replica_groups=` and
`source_target_pairs=`, as flattened device ids. Used by `jaxmon.xla.hlo`, whose docstring says what the
spellings mean and where the facts come from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

Groups = tuple[tuple[int, ...], ...]

# The ones carrying `use_global_device_ids` (XLA gives the others no such field: with a channel_id their ids are
# partition ids).
_GLOBAL_ID_OPS = frozenset({"all-reduce", "all-gather", "reduce-scatter"})

# Bits per element of each element type; sub-byte types take a byte each unless the layout packs them (`E(4)`).
_BITS = {
    "pred": 8,
    "token": 0,
    "opaque": 0,
    "c64": 64,
    "c128": 128,
    "bf16": 16,
    "tf32": 32,
}

CROSS_REPLICA = "cross_replica"
CROSS_PARTITION = "cross_partition"
CROSS_REPLICA_AND_PARTITION = "cross_replica_and_partition"
FLATTENED = "flattened"


class HloParseError(ValueError):
    """The text is not an HLO module this parser understands; the message names the line or attribute."""


# ---------------------------------------------------------------------------------------------------------- shapes

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")
_PACKED = re.compile(r"E\((\d+)\)")


_DTYPE = re.compile(r"(?:[su](?:1|2|4|8|16|32|64)|f(?:16|32|64)|f[468]e\d+m\d+[a-z0-9]*)")


def _bits(dtype: str) -> int:
    known = _BITS.get(dtype)
    if known is not None:
        return known
    if _DTYPE.fullmatch(dtype) is None:
        raise HloParseError(f"unknown element type {dtype!r}")
    # s8, u16, f32, f8e4m3fn (8), f4e2m1fn (4), f6e3m2fn (6), s4, u2, ...: the first number is the width.
    return int(dtype[1:].split("e", 1)[0])


def array_bytes(shape: str) -> int:
    """Bytes of every array in `shape` (a tuple's leaves summed); dims as `<=N` (bounded dynamic) count N."""
    total_bits = 0
    for dtype, dims, layout in _ARRAY.findall(shape):
        n = 1
        for d in dims.split(","):
            d = d.strip().removeprefix("<=")
            if d:
                if not d.isdigit():
                    raise HloParseError(f"unknown dimension {d!r} in shape {shape!r}")
                n *= int(d)
        bits = _bits(dtype)
        packed = _PACKED.search(layout) if layout else None
        if packed:
            bits = int(packed.group(1))
        elif 0 < bits < 8:
            bits = 8
        total_bits += n * bits
    return (total_bits + 7) // 8


def _tuple_elements(shape: str) -> list[str] | None:
    """The top-level elements of a tuple shape (`(a, (b, c))` -> [`a`, `(b, c)`]); None when it is not a tuple."""
    shape = shape.strip()
    if not shape.startswith("("):
        return None
    out: list[str] = []
    depth = 0
    start = 1
    for i, ch in enumerate(shape):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                out.append(shape[start:i])
                break
        elif ch == "," and depth == 1:
            out.append(shape[start:i])
            start = i + 1
    return [re.sub(r"/\*.*?\*/", "", e).strip() for e in out if e.strip()]


def collective_bytes(op: str, shape: str, group_size: int, start: bool) -> int:
    """Bytes one device moves in one execution of `op` with result `shape`, by nccl-tests' convention."""
    operands = results = shape
    if start:
        elements = _tuple_elements(shape)
        nested = elements is not None and len(elements) >= 2 and elements[0].startswith("(")
        if elements is not None and len(elements) >= 2 and (op != "all-reduce" or nested):
            operands, results = elements[0], elements[1]
        if op == "reduce-scatter" and operands is not shape:
            return array_bytes(operands)
    if op == "all-gather":
        return array_bytes(results)
    if op == "reduce-scatter":
        return array_bytes(results) * group_size
    if start:
        return array_bytes(operands)
    return array_bytes(shape)


# ---------------------------------------------------------------------------------------------------------- groups


def _iota(dims: Sequence[int], perm: Sequence[int]) -> list[int]:
    """range(prod(dims)) reshaped to `dims` and transposed by `perm`, flattened (row-major)."""
    return _transpose(list(range(math.prod(dims))), dims, perm)


def _transpose(values: Sequence[int], dims: Sequence[int], perm: Sequence[int]) -> list[int]:
    """`values` (row-major over `dims`) transposed by `perm`, flattened."""
    if sorted(perm) != list(range(len(dims))):
        raise HloParseError(f"transpose {tuple(perm)} is not a permutation of {len(dims)} dims")
    strides = [0] * len(dims)
    step = 1
    for i in range(len(dims) - 1, -1, -1):
        strides[i] = step
        step *= dims[i]
    out_dims = [dims[p] for p in perm]
    out_strides = [strides[p] for p in perm]
    out: list[int] = []
    # Iterate the output index odometer-style: linear in the number of elements.
    index = [0] * len(out_dims)
    offset = 0
    total = math.prod(out_dims)
    for _ in range(total):
        out.append(values[offset])
        for k in range(len(out_dims) - 1, -1, -1):
            index[k] += 1
            offset += out_strides[k]
            if index[k] < out_dims[k]:
                break
            offset -= out_strides[k] * out_dims[k]
            index[k] = 0
    return out


def _chunk(flat: Sequence[int], size: int) -> Groups:
    if size <= 0 or len(flat) % size:
        raise HloParseError(f"{len(flat)} devices do not split into groups of {size}")
    return tuple(tuple(flat[i : i + size]) for i in range(0, len(flat), size))


_INTS = re.compile(r"\d+")
_EXPLICIT_GROUP = re.compile(r"\{([^{}]*)\}")
_LIST = r"(\d+(?:,\d+)*)"
_IOTA = re.compile(r"(?:devices=)?\[(\d+),(\d+)\]<=\[" + _LIST + r"\](?:T\(" + _LIST + r"\))?")
# A mesh's device ids, as the printers spell them (see _device_list).
_IDS_IOTA = re.compile(r"\[" + _LIST + r"\]<=\[" + _LIST + r"\](?:T\(" + _LIST + r"\))?")
_IDS_RESHAPE = re.compile(r"\[" + _LIST + r"\](?:T\(" + _LIST + r"\))?")
_IDS_LIST = re.compile(r"(?:\[" + _LIST + r"\])?" + _LIST)
# One `name=size` of a mesh and one axis reference (`name` or `name:(pre_size)size`), each followed by a comma or
# the end; a name quoted (jax 0.10's XLA, any character but the quote) or bare (XLA's sources today).
_NAME = r"\s*(?:'([^']*)'|([^'=:,\s]+))"
_MESH_AXIS = re.compile(_NAME + r"=(\d+)\s*(?:,|$)")
_AXIS_REF = re.compile(_NAME + r"(?::\((\d+)\)(\d+))?\s*(?:,|$)")


def _explicit(text: str) -> Groups:
    """`{{0,1},{2,3}}` -> ((0, 1), (2, 3)); `{}` -> () (everyone)."""
    inner = text.strip()[1:-1]
    return tuple(tuple(int(i) for i in _INTS.findall(g)) for g in _EXPLICIT_GROUP.findall(inner))


def _ints(text: str) -> list[int]:
    return [int(i) for i in text.split(",")]


def _iota_groups(text: str) -> Groups:
    """`[groups,size]<=[dims]T(perm)` (IotaReplicaGroupList; an older printer put `devices=` in front)."""
    m = _IOTA.fullmatch(text.strip())
    if m is None:
        raise HloParseError(f"cannot read iota replica groups {text!r}")
    groups, size = int(m.group(1)), int(m.group(2))
    dims = _ints(m.group(3))
    perm = _ints(m.group(4)) if m.group(4) else list(range(len(dims)))
    if math.prod(dims) != groups * size:
        raise HloParseError(f"iota replica groups {text!r}: {groups}x{size} is not the {math.prod(dims)} devices")
    return _chunk(_iota(dims, perm), size)


def _device_list(text: str, count: int) -> list[int]:
    """The `device_ids=(...)` of a mesh, row-major over its axes, in every spelling of XLA's TileAssignment:
    `[4,2]T(1,0)` (an iota of the reshape dims, transposed: Mesh::ToString today, what optax's optimizers compile
    to), `0,4,1,5,...` (the ids), and the full `[dims]<=[4,2]T(1,0)` and `[dims]0,4,1,5,...` (TileAssignment's own
    printer, optionally after `devices=`)."""
    spelled = re.sub(r"\s+", "", text).removeprefix("devices=")
    ids: list[int]
    if (m := _IDS_IOTA.fullmatch(spelled)) is not None:
        if math.prod(_ints(m.group(1))) != count:
            raise HloParseError(f"mesh device ids {text!r} are not {count} ids")
        dims = _ints(m.group(2))
        ids = _iota(dims, _ints(m.group(3)) if m.group(3) else list(range(len(dims))))
    elif (m := _IDS_RESHAPE.fullmatch(spelled)) is not None:
        dims = _ints(m.group(1))
        ids = _iota(dims, _ints(m.group(2)) if m.group(2) else list(range(len(dims))))
    elif (m := _IDS_LIST.fullmatch(spelled)) is not None:
        if m.group(1) is not None and math.prod(_ints(m.group(1))) != count:
            raise HloParseError(f"mesh device ids {text!r} are not {count} ids")
        ids = _ints(m.group(2))
    else:
        raise HloParseError(f"cannot read mesh device ids {text!r}")
    if sorted(ids) != list(range(count)):
        raise HloParseError(f"mesh device ids {text!r} are not the {count} ids 0..{count - 1}")
    return ids


def _items(pattern: re.Pattern[str], text: str, what: str) -> list[tuple[str, ...]]:
    """Every comma-separated item of `text`, read by `pattern` (its name in group 1 quoted or 2 bare, the rest
    after, "" where absent); anything else is an error, never skipped."""
    out: list[tuple[str, ...]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = pattern.match(text, pos)
        if m is None or m.end() == pos:
            raise HloParseError(f"cannot read {what} {text!r} at {text[pos:]!r}")
        quoted, bare, *rest = m.groups()
        out.append((quoted if quoted is not None else bare, *(r or "" for r in rest)))
        pos = m.end()
    return out


def _mesh_groups(axes_text: str, devices_text: str | None, refs_text: str) -> Groups:
    """Groups of the mesh-axes spelling: the devices that differ only along the referenced (sub-)axes, as XLA's
    MeshAxesReplicaGroupList expands them."""
    axes = [(name, int(size)) for name, size in _items(_MESH_AXIS, axes_text, "mesh axes")]
    if not axes:
        if refs_text.strip() or devices_text:
            raise HloParseError(f"mesh replica groups without axes: mesh[{axes_text}] {{{refs_text}}}")
        return ()  # an empty mesh: no groups written, everyone
    names = [a for a, _ in axes]
    sizes = [s for _, s in axes]
    count = math.prod(sizes)
    devices = _device_list(devices_text, count) if devices_text else list(range(count))
    refs: list[tuple[int, int, int] | tuple[int, None, None]] = []
    for name, pre_size, sub_size in _items(_AXIS_REF, refs_text, "mesh axis references"):
        if name not in names:
            raise HloParseError(f"mesh replica groups name axis {name!r}, not one of {names}")
        index = names.index(name)
        refs.append((index, int(pre_size), int(sub_size)) if pre_size else (index, None, None))
    # Split each mesh dim into the pieces its references need; remember which new dim each reference is.
    new_dims: list[int] = []
    ref_dim: dict[int, int] = {}
    for dim, full in enumerate(sizes):
        on_dim = [(k, r) for k, r in enumerate(refs) if r[0] == dim]
        if not on_dim:
            new_dims.append(full)
            continue
        if len(on_dim) == 1 and on_dim[0][1][1] is None:
            ref_dim[on_dim[0][0]] = len(new_dims)
            new_dims.append(full)
            continue
        covered = 1
        for k, (_, pre, size) in sorted(on_dim, key=lambda kr: kr[1][1] or 0):
            if pre is None or size is None:
                raise HloParseError(f"mesh replica groups {{{refs_text}}} mix a whole axis with its sub-axes")
            if pre != covered:
                new_dims.append(pre // covered)
                covered = pre
            ref_dim[k] = len(new_dims)
            new_dims.append(size)
            covered *= size
        if covered != full:
            new_dims.append(full // covered)
    if math.prod(new_dims) != count:
        raise HloParseError(f"mesh replica groups {{{refs_text}}} do not divide mesh[{axes_text}]")
    grouped = [ref_dim[k] for k in range(len(refs))]
    perm = [d for d in range(len(new_dims)) if d not in grouped] + grouped
    size = math.prod(new_dims[d] for d in grouped)
    return _chunk(_transpose(devices, new_dims, perm), size)


def _flatten(groups: Groups, mode: str, replicas: int, partitions: int) -> Groups:
    """Groups of replica or partition ids as flattened ids (`replica * partitions + partition`), as XLA's
    GetParticipatingDevicesGroups makes them; `()` (no groups written) means everyone."""
    if mode == FLATTENED:
        return groups or (tuple(range(replicas * partitions)),)
    if mode == CROSS_PARTITION:
        rows = groups or (tuple(range(partitions)),)
        return tuple(tuple(r * partitions + p for p in row) for r in range(replicas) for row in rows)
    if mode == CROSS_REPLICA:
        rows = groups or (tuple(range(replicas)),)
        return tuple(tuple(r * partitions + p for r in row) for p in range(partitions) for row in rows)
    rows = groups or (tuple(range(replicas)),)  # CROSS_REPLICA_AND_PARTITION: every partition of the replicas
    return tuple(tuple(r * partitions + p for p in range(partitions) for r in row) for row in rows)


def group_mode(op: str, has_channel_id: bool, use_global_device_ids: bool) -> str:
    """What a collective's ids are (XLA's GetCollectiveOpGroupMode)."""
    if not has_channel_id:
        return CROSS_REPLICA
    if op not in _GLOBAL_ID_OPS:
        return CROSS_PARTITION
    return FLATTENED if use_global_device_ids else CROSS_REPLICA_AND_PARTITION


_CHANNEL = re.compile(r"\bchannel_id=\d+")
_GLOBAL_IDS = re.compile(r"\buse_global_device_ids=true")
_GROUPS = re.compile(
    r"\breplica_groups=(?:"
    r"(?P<explicit>\{(?:[^{}]|\{[^{}]*\})*\})"
    r"|(?P<iota>(?:devices=)?\[\d+,\d+\]<=\[[\d,]+\](?:T\([\d,]+\))?)"
    r"|maximal_mesh\[device_id=(?P<maximal>\d+)\]\s*\{\s*\}"
    r"|mesh\[(?P<axes>(?:'[^']*'|[^\]'])*)\]"
    r"(?:,\s*device_ids=\((?P<devices>(?:[^()]|\([^()]*\))*)\))?"
    r"\s*\{(?P<refs>(?:'[^']*'|[^}'])*)\})"
)
_ANY_GROUPS = re.compile(r"\breplica_groups=")
_PAIRS = re.compile(r"\bsource_target_pairs=(\{(?:[^{}]|\{[^{}]*\})*\})")


class GroupReader:
    """Reads a collective's groups as flattened ids, caching each spelling (a program repeats a few many times)."""

    def __init__(self, replicas: int = 1, partitions: int = 1) -> None:
        self.replicas = replicas
        self.partitions = partitions
        self.cache: dict[tuple[str, str], Groups] = {}

    def read(self, op: str, line: str) -> Groups:
        """The groups of the collective `op` on instruction line `line`."""
        mode = group_mode(op, _CHANNEL.search(line) is not None, _GLOBAL_IDS.search(line) is not None)
        if op == "collective-permute":
            m = _PAIRS.search(line)
            if m is None:
                raise HloParseError(f"collective-permute without source_target_pairs: {line.strip()[:200]}")
            spelling = m.group(1)
        else:
            m = _GROUPS.search(line)
            if m is None and _ANY_GROUPS.search(line) is not None:
                raise HloParseError(f"cannot read the replica_groups of {line.strip()[:300]}")
            spelling = m.group(0) if m else "{}"  # no replica_groups: everyone
        key = (mode, spelling)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        if op == "collective-permute":
            raw = _explicit(spelling)
        elif m is None or m.group("explicit"):
            raw = _explicit(m.group("explicit") if m else "{}")
        elif m.group("iota"):
            raw = _iota_groups(m.group("iota"))
        elif m.group("maximal"):
            raw = ((int(m.group("maximal")),),)  # a mesh of one device: a group of one
        else:
            raw = _mesh_groups(m.group("axes"), m.group("devices"), m.group("refs"))
        # The pairs of a collective-permute read as groups of two; none written means none (not everyone).
        out = () if op == "collective-permute" and not raw else _flatten(raw, mode, self.replicas, self.partitions)
        self.cache[key] = out
        return out
