"""Collectives from compiled HLO: real programs JAX compiles on the 8 CPU devices of this process, under a
Mesh(("data", "model"), (4, 2)), each expected figure derived from the test's own shapes; and literal HLO for what the
CPU backend does not print (async start/done pairs, tuple shapes, dtypes, group modes, nested loops)."""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax, shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmon.xla.hlo import HloParseError, MeshLayout, mesh_axes, parse, summarize
from jaxmon.xla.hlo_groups import array_bytes

F32 = 4
BATCH, D_IN, D_OUT = 64, 256, 128  # a batch of 64 rows, sharded 4 ways over "data": 16 rows a device


def layout_of(mesh: Mesh) -> MeshLayout:
    return MeshLayout(tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(d.id for d in mesh.devices.flat))


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    assert jax.device_count() >= 8, "run with JAX_NUM_CPU_DEVICES=8"
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def hlo(fn: Callable[..., Any], *args: Any) -> str:
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert text is not None
    return text


def smap(mesh: Mesh, in_specs: Any, out_specs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return partial(shard_map, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


# ------------------------------------------------------------------------------------------- real compiled programs


def _grad_step(mesh: Mesh) -> tuple[str, Any]:
    """Data parallelism: weights replicated, the batch sharded over "data"; the gradient is all-reduced over it."""
    w = jax.device_put(jnp.ones((D_IN, D_OUT)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((BATCH, D_IN)), NamedSharding(mesh, P("data")))
    compiled = jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w)))).lower(w, x).compile()
    text = compiled.as_text()
    assert text is not None
    return text, compiled


def test_a_replicated_gradient_is_all_reduced_over_data_with_the_gradients_bytes(mesh: Mesh) -> None:
    text, _ = _grad_step(mesh)
    # jax 0.10's CPU backend spells these groups with the compiler's own mesh axes: the test reads that spelling
    # there (0.9, jaxmon's floor, spells them as lists; the literal-HLO tests below read every spelling on any jax).
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10):
        assert "replica_groups=mesh[" in text, "the mesh-axes spelling this test exercises is gone from the HLO"
    program = parse(text)
    assert program.num_partitions == 8 and program.replica_count == 1
    [c] = program.collectives
    assert (c.op, c.bytes, c.group_size, c.multiplier) == ("all-reduce", D_IN * D_OUT * F32, 4, 1)
    assert c.groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert summarize(program, layout_of(mesh)) == {("all-reduce", ("data",)): D_IN * D_OUT * F32}
    assert summarize(program) == {("all-reduce", ()): D_IN * D_OUT * F32}  # no mesh: no axes


def test_the_groups_are_positions_in_the_programs_device_assignment_not_device_ids() -> None:
    # A mesh whose devices are not in id order compiles to the very same groups: they index the program's devices.
    order = [3, 0, 6, 1, 2, 7, 5, 4]
    permuted = Mesh(np.array(jax.devices()[:8])[order].reshape(4, 2), ("data", "model"))
    text, compiled = _grad_step(permuted)
    program = parse(text)
    [c] = program.collectives
    assert c.groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    layout = layout_of(permuted)
    assignment = [d.id for d in compiled.input_shardings[0][0]._device_assignment]
    assert assignment == order
    assert mesh_axes(c.groups, layout) == ("data",)  # ids as positions in the mesh: what JAX compiled
    assert mesh_axes(c.groups, layout, assignment) == ("data",)  # through the device assignment: the same
    # Reading the ids as device ids would be wrong: devices 0, 2, 4, 6 sit at both "model" indices of this mesh.
    assert mesh_axes(c.groups, layout, list(range(8))) == ("data", "model")


def test_a_collective_in_a_scan_over_layers_counts_once_per_layer(mesh: Mesh) -> None:
    layers = 6

    @smap(mesh, (P(None, "data", "model"), P("data", "model")), P("data", "model"))
    def stack(ws: jax.Array, h: jax.Array) -> jax.Array:
        def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
            return lax.psum(jnp.tanh(h * w), "model"), None

        return lax.scan(layer, h, ws)[0]

    text = hlo(stack, jnp.ones((layers, BATCH, D_IN)), jnp.ones((BATCH, D_IN)))
    assert '"known_trip_count":{"n":"6"}' in text  # a loop, not unrolled: the multiplier is what is tested
    program = parse(text)
    [c] = program.collectives
    per_layer = (BATCH // 4) * (D_IN // 2) * F32  # each device's block of h
    assert (c.op, c.bytes, c.multiplier) == ("all-reduce", per_layer, layers)
    assert summarize(program, layout_of(mesh)) == {("all-reduce", ("model",)): per_layer * layers}


def test_the_gradient_of_a_sharded_scan_multiplies_every_collective_of_its_loops(mesh: Mesh) -> None:
    layers = 5
    ws = jax.device_put(jnp.ones((layers, D_IN, D_IN)), NamedSharding(mesh, P(None, None, "model")))
    x = jax.device_put(jnp.ones((BATCH, D_IN)), NamedSharding(mesh, P("data")))

    def loss(ws: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.sum(lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0])

    text = hlo(jax.grad(loss), ws, x)
    # The spellings XLA chose here: iota groups, plain and transposed, beside the mesh-axes one.
    assert "replica_groups=[4,2]<=[8]" in text and "replica_groups=[2,4]<=[4,2]T(1,0)" in text
    program = parse(text)
    assert {c.multiplier for c in program.collectives} == {layers}
    totals = summarize(program, layout_of(mesh))
    # Backward: each layer's weight gradient, (D_IN, D_IN / 2) a device, is summed over the data shards.
    assert totals[("all-reduce", ("data",))] == layers * D_IN * (D_IN // 2) * F32
    assert {axes for _, axes in totals} == {("data",), ("model",)}


def test_a_shard_map_psum_over_model_spans_model(mesh: Mesh) -> None:
    @smap(mesh, P("data", "model"), P("data"))
    def f(x: jax.Array) -> jax.Array:
        return lax.psum(x, "model")

    text = hlo(f, jnp.ones((BATCH, D_IN)))
    assert "replica_groups={{0,1},{2,3},{4,5},{6,7}}" in text  # the explicit spelling
    program = parse(text)
    block = (BATCH // 4) * (D_IN // 2) * F32
    assert summarize(program, layout_of(mesh)) == {("all-reduce", ("model",)): block}
    assert program.collectives[0].group_size == 2


def test_a_psum_over_both_axes_spans_both(mesh: Mesh) -> None:
    @smap(mesh, P("data", "model"), P())
    def f(x: jax.Array) -> jax.Array:
        return lax.psum(x, ("data", "model"))

    program = parse(hlo(f, jnp.ones((BATCH, D_IN))))
    assert summarize(program, layout_of(mesh)) == {("all-reduce", ("data", "model")): (BATCH // 4) * (D_IN // 2) * 4}
    assert program.collectives[0].group_size == 8


def test_all_gather_counts_the_gathered_output_and_reduce_scatter_the_input(mesh: Mesh) -> None:
    @smap(mesh, P("data", "model"), P("data"))
    def gather(x: jax.Array) -> jax.Array:
        return lax.all_gather(x, "model", axis=1, tiled=True)

    @smap(mesh, P("data"), P("data", "model"))
    def scatter(x: jax.Array) -> jax.Array:
        return lax.psum_scatter(x, "model", scatter_dimension=1, tiled=True)

    layout = layout_of(mesh)
    rows = BATCH // 4
    gathered = parse(hlo(gather, jnp.ones((BATCH, D_IN))))
    assert summarize(gathered, layout) == {("all-gather", ("model",)): rows * D_IN * F32}  # not rows * D_IN / 2
    scattered = parse(hlo(scatter, jnp.ones((BATCH, D_IN))))
    assert summarize(scattered, layout) == {("reduce-scatter", ("model",)): rows * D_IN * F32}  # not the half kept


def test_all_to_all_and_permute_count_their_operand(mesh: Mesh) -> None:
    @smap(mesh, P("data", "model"), P("data", "model"))
    def a2a(x: jax.Array) -> jax.Array:
        return lax.all_to_all(x, "data", 0, 1, tiled=True)

    @smap(mesh, P("data", "model"), P("data", "model"))
    def ring(x: jax.Array) -> jax.Array:
        return lax.ppermute(x, "data", perm=[(i, (i + 1) % 4) for i in range(4)])

    layout = layout_of(mesh)
    block = (BATCH // 4) * (D_IN // 2) * F32
    a2a_text = hlo(a2a, jnp.ones((BATCH, D_IN)))
    assert ") all-to-all(" in a2a_text  # XLA:CPU splits it into a tuple of four pieces: their sum is the block
    assert summarize(parse(a2a_text), layout) == {("all-to-all", ("data",)): block}
    ring_program = parse(hlo(ring, jnp.ones((BATCH, D_IN))))
    assert summarize(ring_program, layout) == {("collective-permute", ("data",)): block}
    assert ring_program.collectives[0].groups[:4] == ((0, 2), (2, 4), (4, 6), (6, 0))


def test_a_program_without_collectives_has_none(mesh: Mesh) -> None:
    x = jax.device_put(jnp.ones((BATCH, D_IN)), NamedSharding(mesh, P("data", "model")))
    program = parse(hlo(lambda x: jnp.tanh(x) * 2, x))
    assert program.collectives == () and summarize(program, layout_of(mesh)) == {}


# ------------------------------------------------------------------------------------------------------ literal HLO


def module(*computations: str, header: str = "num_partitions=8") -> str:
    return "HloModule m, is_scheduled=true, " + header + "\n\n" + "\n\n".join(computations) + "\n"


def entry(*lines: str) -> str:
    return "ENTRY %main (p: f32[64]) -> f32[64] {\n" + "\n".join("  " + line for line in lines) + "\n}"


def computation(name: str, *lines: str) -> str:
    return f"%{name} (p: f32[64]) -> f32[64] {{\n" + "\n".join("  " + line for line in lines) + "\n}"


def only(text: str) -> Any:
    [c] = parse(text).collectives
    return c


AR = "channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add"
ADD = "%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n" + (
    "  ROOT %s = f32[] add(%a, %b)\n}"
)


# Every spelling of replica_groups XLA's printers write (xla/hlo/ir/replica_group.cc, tile_assignment.cc,
# mesh_and_axis.cc): the groups each stands for, worked out by hand from XLA's definitions.
SPELLINGS = [
    # CollectiveDeviceList: the groups as lists.
    ("{{0,1},{2,3},{4,5},{6,7}}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("{{0,2,4,6},{1,3,5,7}}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    # IotaReplicaGroupList: [groups,size]<=[reshape dims], transposed by T(perm).
    ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("[2,4]<=[4,2]T(1,0)", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("[4,2]<=[2,2,2]T(2,1,0)", ((0, 4), (2, 6), (1, 5), (3, 7))),
    ("devices=[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),  # an older printer's, with TileAssignment's prefix
    # MeshAxesReplicaGroupList: mesh[axes] {the axes a group spans}; the groups are the devices that differ along
    # them only, each group ordered by the listed axes.
    ("mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("mesh['a'=2,'b'=4] {'a','b'}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("mesh['a'=2,'b'=4] {'b','a'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),  # the listed order orders each group
    ("mesh['a'=2,'b'=4] {}", tuple((i,) for i in range(8))),  # no axis: each device alone (a no-op)
    ("mesh[a=2,b=4] {a}", ((0, 4), (1, 5), (2, 6), (3, 7))),  # names unquoted (XLA's sources today)
    ("mesh['a.b'=2,'<axis> def'=4] {'<axis> def':(2)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),  # any name, quoted
    # Sub-axes name:(pre-size)size: a factor of an axis (the middle 2 of 8 = 2x2x2, ...).
    ("mesh['x'=8] {'x':(2)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("mesh['x'=8] {'x':(1)2,'x':(4)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),  # two sub-axes: outer and inner
    ("mesh['x'=8] {'x':(1)2, 'x':(4)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),  # the same, as a sharding spaces them
    ("mesh['x'=8] {'x':(4)2,'x':(1)2}", ((0, 4, 1, 5), (2, 6, 3, 7))),  # inner first: it orders each group
    # The mesh's device ids, where they are not 0..n-1 in order: every spelling of a TileAssignment's array.
    ("mesh['a'=2,'b'=4], device_ids=(7,6,5,4,3,2,1,0) {'a'}", ((7, 3), (6, 2), (5, 1), (4, 0))),  # the ids
    # an iota of the reshape dims, transposed (Mesh::ToString): optax's clip_by_global_norm on a (data, model)
    # mesh (issue 49): the ids 0,4,1,5,2,6,3,7 on a 4x1x2 mesh; then the ids 0,2,4,6,1,3,5,7 on a 2x4 mesh
    ("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("mesh['a'=2,'b'=4], device_ids=([2,2,2]T(2,1,0)) {'b'}", ((0, 4, 2, 6), (1, 5, 3, 7))),  # 0,4,2,6,1,5,3,7
    # TileAssignment's own printer: the dims and the iota (optionally after `devices=`), or the dims and the ids
    ("mesh['a'=2,'b'=4], device_ids=([8]<=[2,4]T(1,0)) {'b'}", ((0, 4, 1, 5), (2, 6, 3, 7))),
    ("mesh['a'=2,'b'=4], device_ids=(devices=[2,4]<=[4,2]T(1,0)) {'a'}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("mesh['a'=2,'b'=4], device_ids=([2,4]0,2,4,6,1,3,5,7) {'a'}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    # A mesh of one device (Mesh::ToString of a maximal mesh), and the empty mesh (everyone, as `{}`).
    ("maximal_mesh[device_id=5] {}", ((5,),)),
    ("mesh[] {}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
]


def all_reduce(spelling: str, devices: int = 8) -> str:
    """A module of `devices` partitions, XLA's own parser reads it too: one all-reduce of global device ids with
    `spelling` as its replica_groups."""
    line = f"%ar = f32[64]{{0}} all-reduce(%p), channel_id=1, replica_groups={spelling}, use_global_device_ids=true"
    return module(ADD, entry("%p = f32[64]{0} parameter(0)", "ROOT " + line + ", to_apply=%add"),
                  header=f"num_partitions={devices}")  # fmt: skip


@pytest.mark.parametrize(("spelling", "groups"), SPELLINGS)
def test_every_replica_group_spelling_expands_to_the_same_ids_xla_would(
    spelling: str, groups: tuple[tuple[int, ...], ...]
) -> None:
    c = only(all_reduce(spelling))
    assert c.groups == groups and c.group_size == len(groups[0])


def xla_groups(text: str) -> list[tuple[tuple[int, ...], ...]]:
    """The groups of each collective of HLO `text`, as XLA itself expands them: the text read by XLA's own HLO
    parser (in jaxlib) and printed back with the fingerprint options, which write every group as a list."""
    api = next(m for m in (_module("jaxlib._hlo"), _module("jaxlib._jax")) if hasattr(m, "hlo_module_from_text"))
    printed = api.hlo_module_from_text(text).to_string(api.HloPrintOptions.fingerprint())
    return [
        tuple(tuple(int(i) for i in g.split(",")) for g in re.findall(r"\{([\d,]+)\}", m.group(1)))
        for m in re.finditer(r"replica_groups=(\{(?:\{[\d,]*\},?)*\})", printed)
    ]


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def xla_reads(text: str) -> bool:
    """Whether this jaxlib's XLA parses `text` (0.9's knows no mesh-axes spelling)."""
    try:
        xla_groups(text)
    except Exception:
        return False
    return True


def random_spellings(seed: int, n: int) -> list[tuple[str, int]]:
    """`n` valid mesh-axes and iota spellings over 4, 8 or 16 devices, with their device counts: meshes of 1-3
    axes, their ids in order, as a permutation or as a transposed iota, groups over whole axes in any order and
    over sub-axes."""
    rng = random.Random(seed)

    def powers(total: int) -> list[int]:  # total (a power of 2) as 1-3 factors
        k = total.bit_length() - 1
        cuts = sorted(rng.randint(0, k) for _ in range(rng.randint(0, 2)))
        return [2 ** (b - a) for a, b in zip([0, *cuts], [*cuts, k], strict=True)]

    def joined(values: list[int]) -> str:
        return ",".join(map(str, values))

    def shuffled(n: int) -> list[int]:  # a permutation of range(n) that is not the identity (n > 1)
        order = list(range(n))
        while order == sorted(order):
            rng.shuffle(order)
        return order

    out: list[tuple[str, int]] = []
    while len(out) < n:
        count = rng.choice([4, 8, 16])
        dims = powers(count)
        if rng.random() < 0.25:  # an iota list: [groups,size]<=[dims]T(perm)
            size = rng.choice([s for s in (1, 2, 4, 8, 16) if s <= count])
            transposed = f"T({joined(shuffled(len(dims)))})" if len(dims) > 1 else ""
            out.append((f"[{count // size},{size}]<=[{joined(dims)}]{transposed}", count))
            continue
        sizes = powers(count)
        names = [f"'ax{i}'" for i in range(len(sizes))]
        ids = ""
        if (r := rng.random()) < 0.35:
            ids = f", device_ids=({joined(shuffled(count))})"
        elif r < 0.7 and len(dims) > 1:
            ids = f", device_ids=([{joined(dims)}]T({joined(shuffled(len(dims)))}))"
        refs = []
        for name, size in zip(names, sizes, strict=True):
            if size == 1 or rng.random() < 0.4:
                continue
            if size >= 4 and rng.random() < 0.5:  # a sub-axis: pre-size 2^i, size 2^j, smaller than the axis
                k = size.bit_length() - 1
                i = rng.randint(0, k - 1)
                refs.append(f"{name}:({2**i}){2 ** rng.randint(1, k - i - (i == 0))}")
            else:
                refs.append(name)
        if refs:  # XLA refuses a group of one device over a mesh
            rng.shuffle(refs)
            axes = ",".join(f"{a}={s}" for a, s in zip(names, sizes, strict=True))
            out.append((f"mesh[{axes}]{ids} {{{','.join(refs)}}}", count))
    return out


def test_every_spelling_expands_to_the_groups_xla_itself_prints() -> None:
    """XLA as the truth: each spelling above that this XLA parses, and 300 random meshes and iotas, expanded by
    jaxmon and by XLA's own parser and printer alike."""
    meshes = xla_reads(all_reduce("mesh['a'=2,'b'=4] {'a'}"))
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10):
        assert meshes, "jax 0.10's XLA parses the mesh-axes spelling: the comparison below needs it"
    compared = []
    for spelling, devices in [(s, 8) for s, _ in SPELLINGS] + random_spellings(49, 300):
        text = all_reduce(spelling, devices)
        if not xla_reads(text):  # an older printer's spelling, or (jax 0.9) any mesh-axes one
            assert not (meshes and "'ax" in spelling), f"XLA refuses the valid {spelling}"
            continue
        [want] = xla_groups(text)
        assert only(text).groups == want, spelling
        compared.append(spelling)
    assert len(compared) >= (300 if meshes else 60), compared
    assert not meshes or "mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}" in compared


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("pred[10]", 10),
        ("s8[10]", 10),
        ("u8[10]", 10),
        ("bf16[10]", 20),
        ("f16[10]", 20),
        ("s16[10]", 20),
        ("f32[10]", 40),
        ("s32[10]", 40),
        ("u32[10]", 40),
        ("f64[10]", 80),
        ("s64[10]", 80),
        ("c64[10]", 80),
        ("c128[10]", 160),
        ("f8e4m3fn[10]", 10),
        ("f8e5m2[10]", 10),
        ("f8e4m3b11fnuz[10]", 10),
        ("s4[10]", 10),  # unpacked: a byte each
        ("s4[10]{0:E(4)}", 5),  # packed by the layout
        ("f32[]", 4),  # a scalar
        ("f32[<=16,8]", 512),  # bounded dynamic: the bound
        ("f32[128,256]{1,0}", 131072),
        ("f32[128,256]{1,0:T(8,128)}", 131072),
        ("(f32[], f32[64,256]{1,0})", 4 + 65536),
        ("(f32[8]{0}, /*index=1*/bf16[8]{0}, (s8[4], pred[]))", 32 + 16 + 4 + 1),
    ],
)
def test_shape_bytes_cover_every_element_width_tuples_and_layouts(shape: str, expected: int) -> None:
    assert array_bytes(shape) == expected


def test_a_combined_all_reduce_counts_every_buffer_of_its_tuple() -> None:
    c = only(module(entry(f"%ar = (f32[], f32[64,256]{{1,0}}) all-reduce(%a, %b), {AR}")))
    assert (c.op, c.bytes) == ("all-reduce", 4 + 64 * 256 * 4)


def test_async_start_done_pairs_count_once_with_the_start_by_the_convention() -> None:
    text = module(
        entry(
            f"%ars = f32[64]{{0}} all-reduce-start(%p), {AR}",
            "%ard = f32[64]{0} all-reduce-done(%ars)",
            f"%arcs = (f32[64]{{0}}, bf16[32]{{0}}) all-reduce-start(%p, %q), {AR}",
            "%arcd = (f32[64]{0}, bf16[32]{0}) all-reduce-done(%arcs)",
            "%ags = (f32[8]{0}, f32[64]{0}) all-gather-start(%p), channel_id=2, replica_groups=[1,8]<=[8],"
            " dimensions={0}, use_global_device_ids=true",
            "%agd = f32[64]{0} all-gather-done(%ags)",
            "%ags2 = ((f32[8]{0}, f32[2]{0}), (f32[64]{0}, f32[16]{0})) all-gather-start(%p, %q), channel_id=3,"
            " replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true",
            "%agd2 = (f32[64]{0}, f32[16]{0}) all-gather-done(%ags2)",
            "%rss = ((f32[64]{0}), f32[8]{0}) reduce-scatter-start(%p), channel_id=4, replica_groups=[1,8]<=[8],"
            " use_global_device_ids=true, dimensions={0}, to_apply=%add",
            "%rsd = f32[8]{0} reduce-scatter-done(%rss)",
            "%cps = (f32[64]{0}, f32[64]{0}, u32[], u32[]) collective-permute-start(%p), channel_id=5,"
            " source_target_pairs={{0,1},{1,0}}",
            "%cpd = f32[64]{0} collective-permute-done(%cps)",
            "%a2as = ((f32[8]{0}, f32[8]{0}), (f32[8]{0}, f32[8]{0})) all-to-all-start(%p, %q), channel_id=6,"
            " replica_groups={{0,1},{2,3},{4,5},{6,7}}",
            "%a2ad = (f32[8]{0}, f32[8]{0}) all-to-all-done(%a2as)",
        )
    )
    got = [(c.name, c.op, c.bytes, c.asynchronous) for c in parse(text).collectives]
    assert got == [
        ("ars", "all-reduce", 256, True),
        ("arcs", "all-reduce", 256 + 64, True),
        ("ags", "all-gather", 256, True),  # the gathered result, not the 32-byte operand
        ("ags2", "all-gather", 256 + 64, True),
        ("rss", "reduce-scatter", 256, True),  # the input, not the 32-byte shard
        ("cps", "collective-permute", 256, True),  # the buffer, not its context scalars
        ("a2as", "all-to-all", 64, True),
    ]


def test_a_generic_async_start_is_followed_into_its_computation_once() -> None:
    wrapped = computation("wrapped", f"ROOT %ar = f32[64]{{0}} all-reduce(%p), {AR}")
    text = module(
        wrapped,
        entry(
            "%s = ((f32[64]{0}), f32[64]{0}, s32[]) async-start(%p), calls=%wrapped",
            "%u = ((f32[64]{0}), f32[64]{0}, s32[]) async-update(%s), calls=%wrapped",
            "%d = f32[64]{0} async-done(%u), calls=%wrapped",
        ),
    )
    c = only(text)
    assert (c.computation, c.bytes, c.multiplier) == ("wrapped", 256, 1)


def _while(name: str, body: str, cond: str, trips: int | None) -> str:
    config = f', backend_config={{"known_trip_count":{{"n":"{trips}"}}}}' if trips is not None else ""
    return f"%{name} = (s32[], f32[64]{{0}}) while(%t), condition=%{cond}, body=%{body}{config}"


def test_nested_loops_multiply_and_calls_and_fusions_carry_the_count() -> None:
    text = module(
        computation("cond", "ROOT %lt = pred[] compare(%a, %b), direction=LT"),
        computation("called", f"ROOT %ar = f32[64]{{0}} all-reduce(%p), {AR}"),
        computation("fused", f"ROOT %ag = f32[64]{{0}} all-gather(%p), {AR.replace('to_apply=%add', 'dims={0}')}"),
        computation(
            "inner",
            f"%ar = f32[16]{{0}} all-reduce(%p), {AR}",
            "%c = f32[64]{0} call(%p), to_apply=%called",
            "ROOT %f = f32[64]{0} fusion(%p), kind=kLoop, calls=%fused",
        ),
        computation("outer", f"%ar = f32[32]{{0}} all-reduce(%p), {AR}", _while("w", "inner", "cond", 4)),
        computation("loose", f"%ar = f32[8]{{0}} all-reduce(%p), {AR}"),
        entry(
            _while("w", "outer", "cond", 3),
            _while("w2", "loose", "cond", None),
            f"%ar = f32[64]{{0}} all-reduce(%p), {AR}",
        ),
    )
    program = parse(text)
    got = {(c.computation, c.op): (c.multiplier, c.unknown_trips) for c in program.collectives}
    assert got == {
        ("main", "all-reduce"): (1, False),
        ("outer", "all-reduce"): (3, False),
        ("inner", "all-reduce"): (12, False),
        ("called", "all-reduce"): (12, False),
        ("fused", "all-gather"): (12, False),
        ("loose", "all-reduce"): (1, True),  # no known trip count: once per run of the loop, flagged
    }
    assert summarize(program) == {
        ("all-reduce", ()): 256 + 3 * 128 + 12 * 64 + 12 * 256 + 32,
        ("all-gather", ()): 12 * 256,
    }


def test_a_conditional_counts_its_heaviest_branch_and_marks_its_collectives() -> None:
    text = module(
        computation("light", f"ROOT %ar = f32[4]{{0}} all-reduce(%p), {AR}"),
        computation("heavy", f"ROOT %ar = f32[64]{{0}} all-reduce(%p), {AR}"),
        computation("none", "ROOT %n = f32[64]{0} negate(%p)"),
        entry("%c = f32[64]{0} conditional(%i, %p, %p, %p), branch_computations={%light, %heavy, %none}"),
    )
    program = parse(text)
    got = {c.computation: (c.multiplier, c.conditional) for c in program.collectives}
    assert got == {"light": (0, True), "heavy": (1, True)}
    assert summarize(program) == {("all-reduce", ()): 256}
    text = text.replace(
        "branch_computations={%light, %heavy, %none}", "true_computation=%light, false_computation=%none"
    )
    assert summarize(parse(text)) == {("all-reduce", ()): 16}


def test_the_reducer_of_an_all_reduce_is_not_a_place_collectives_run() -> None:
    add = "%add (a: f32[], b: f32[]) -> f32[] {\n  ROOT %s = f32[] add(%a, %b)\n}"
    c = only(module(add, entry(f"%ar = f32[64]{{0}} all-reduce(%p), {AR}")))
    assert c.multiplier == 1


@pytest.mark.parametrize(
    ("header", "attrs", "groups"),
    [
        # No channel_id: replica ids, one group per partition (here one partition).
        ("replica_count=4", "replica_groups={{0,1},{2,3}}", ((0, 1), (2, 3))),
        ("replica_count=4", "replica_groups={}", ((0, 1, 2, 3),)),  # none written: everyone
        # A channel_id without use_global_device_ids on an all-reduce: replica ids across every partition.
        ("replica_count=2, num_partitions=2", "channel_id=1, replica_groups={{0,1}}", ((0, 2, 1, 3),)),
        # use_global_device_ids: flattened ids replica * partitions + partition, as written.
        ("replica_count=2, num_partitions=2", "channel_id=1, replica_groups={{0,3}}, use_global_device_ids=true",
         ((0, 3),)),
        # Cross-replica on a partitioned module: the group repeats in every partition.
        ("replica_count=2, num_partitions=2", "replica_groups={{0,1}}", ((0, 2), (1, 3))),
    ],
)  # fmt: skip
def test_the_group_mode_decides_what_the_ids_are(header: str, attrs: str, groups: tuple[tuple[int, ...]]) -> None:
    c = only(module(entry(f"%ar = f32[64]{{0}} all-reduce(%p), {attrs}, to_apply=%add"), header=header))
    assert c.groups == groups


def test_partition_ids_of_an_all_to_all_repeat_in_every_replica() -> None:
    line = "%a = f32[64]{0} all-to-all(%p), channel_id=1, replica_groups={{0,1}}, dimensions={0}"
    c = only(module(entry(line), header="replica_count=2, num_partitions=2"))
    assert c.groups == ((0, 1), (2, 3))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("HloModule m\n\n%f (p: f32[]) -> f32[] {\n  ROOT %p = f32[] parameter(0)\n}\n", "no ENTRY"),
        (module(entry(_while("w", "gone", "gone", 2))), "'gone' is called but not defined"),
        (module(entry(f"%ar = f32[64]{{0}} all-reduce(%p), {AR.replace('{{0,1,2,3,4,5,6,7}}', '[3,3]<=[8]')}")),
         "3x3"),
        (module(entry("%ar = f32[64]{0} all-reduce(%p), replica_groups=mesh['a'=8] {'b'}")), "axis 'b'"),
        (module(entry("%ar = q7[64]{0} all-reduce(%p), replica_groups={}")), "unknown element type"),
        (all_reduce("mesh['a'=2,'b'=4], device_ids=(0,1,2) {'a'}"), r"'0,1,2' are not the 8 ids 0\.\.7"),
        (all_reduce("mesh['a'=2,'b'=4], device_ids=(0,0,1,2,3,4,5,6) {'a'}"), "are not the 8 ids"),
        (all_reduce("mesh['a'=2,'b'=4], device_ids=([4,4]T(1,0)) {'a'}"), r"'\[4,4\]T\(1,0\)' are not the 8 ids"),
        (all_reduce("mesh['a'=2,'b'=4], device_ids=([2,4]<=[16]) {'a'}"), "cannot read mesh device ids|not the 8"),
        (all_reduce("mesh['a'=2,'b'=4], device_ids=(T(1,0)) {'a'}"), "cannot read mesh device ids 'T"),
        (all_reduce("mesh['a'=2 'b'=4] {'a'}"), "cannot read mesh axes"),
        (all_reduce("mesh['a'=2,'b'=4] {'a' 'b'}"), "cannot read mesh axis references"),
        (all_reduce("mesh['a'=2,'b'=4] {'a'}; <<a spelling of tomorrow>>").replace("mesh", "tiles"),
         "cannot read the replica_groups of"),
    ],
)  # fmt: skip
def test_bad_text_raises_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(HloParseError, match=message):
        parse(text)


# ------------------------------------------------------------------------------------------------------- mesh axes

LAYOUT = MeshLayout(("data", "model"), (4, 2), tuple(range(8)))


@pytest.mark.parametrize(
    ("groups", "axes"),
    [
        (((0, 1), (2, 3), (4, 5), (6, 7)), ("model",)),
        (((0, 2, 4, 6), (1, 3, 5, 7)), ("data",)),
        (((0, 2), (4, 6), (1, 3), (5, 7)), ("data",)),  # a part of the data axis still travels along it
        ((tuple(range(8)),), ("data", "model")),
        (((0,), (1,)), ()),  # no two members: no axis
        (((0, 8),), ()),  # an id the mesh does not hold
        ((), ()),
    ],
)
def test_groups_map_to_the_axes_along_which_their_members_differ(
    groups: tuple[tuple[int, ...], ...], axes: tuple[str, ...]
) -> None:
    assert mesh_axes(groups, LAYOUT) == axes


def test_a_device_assignment_maps_ids_through_device_ids() -> None:
    layout = MeshLayout(("data", "model"), (4, 2), (10, 11, 12, 13, 14, 15, 16, 17))
    # Program position i runs on device 17 - i: position 0 and 1 are devices 17 and 16, the last "data" row.
    assert mesh_axes(((0, 1),), layout, [17, 16, 15, 14, 13, 12, 11, 10]) == ("model",)
    assert mesh_axes(((0, 2),), layout, [17, 16, 15, 14, 13, 12, 11, 10]) == ("data",)
    assert mesh_axes(((0, 1),), layout, [17, 99]) == ()  # a device not in the mesh


def test_a_mesh_layout_that_does_not_add_up_is_refused() -> None:
    with pytest.raises(ValueError, match="holds 8 devices, not 7"):
        MeshLayout(("data", "model"), (4, 2), tuple(range(7)))
    with pytest.raises(ValueError, match="2 axis names"):
        MeshLayout(("data", "model"), (8,), tuple(range(8)))


def test_ragged_all_to_all_counts_its_output_buffer_and_collective_broadcast_its_operand() -> None:
    text = module(
        entry(
            "%r = bf16[64,128]{1,0} ragged-all-to-all(%in, %out, %io, %ss, %oo, %rs), channel_id=1,"
            " replica_groups={{0,1,2,3},{4,5,6,7}}",
            "%b = f32[32]{0} collective-broadcast(%p), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}",
        )
    )
    got = [(c.op, c.bytes, c.group_size) for c in parse(text).collectives]
    assert got == [("ragged-all-to-all", 64 * 128 * 2, 4), ("collective-broadcast", 32 * 4, 2)]
    assert summarize(parse(text), LAYOUT) == {
        ("ragged-all-to-all", ("data", "model")): 64 * 128 * 2,
        ("collective-broadcast", ("model",)): 128,
    }
