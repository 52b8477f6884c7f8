"""`jaxmon top`'s frame: a header with each endpoint's health and a table of device rows, drawn with rich."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich import box
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from jaxmon.top.fetch import EndpointState, clip
from jaxmon.top.jobs import Job, JobProcess, jobs
from jaxmon.top.rows import ProcessRow, Row, sort_processes, sort_rows

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
BAR_WIDTH = 10
DOWN_CELL = BAR_WIDTH + 16  # a down row's reason gets the width of "[bar] 20.0GiB/60.0GiB"; the header has it whole
ONCE_PROCESS_ROWS = 10  # --once has no screen to fit: the largest ten, then how many more
JOB_ROWS = 8  # processes listed per job, the slowest first; the rest are counted


@dataclass(frozen=True)
class Glyphs:
    """Characters of one frame: box-drawing for a terminal, ASCII for pipes and scripts."""

    absent: str
    full: str
    empty: str


UNICODE = Glyphs(absent="—", full="█", empty="░")
ASCII = Glyphs(absent="-", full="#", empty=".")


def fmt_bytes(value: float) -> str:
    """Binary units with one decimal: 20.0GiB, 512.0MiB, 9000B."""
    size, unit = float(value), 0
    while abs(size) >= 1024 and unit < len(_UNITS) - 1:
        size /= 1024
        unit += 1
    return f"{size:.0f}B" if unit == 0 else f"{size:.1f}{_UNITS[unit]}"


def fmt_seconds(value: float) -> str:
    """A duration for people: 850us, 12.3ms, 1.25s, 3m05s."""
    if value < 1e-3:
        return f"{value * 1e6:.0f}us"
    if value < 1:
        return f"{value * 1e3:.1f}ms"
    if value < 60:
        return f"{value:.2f}s"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes}m{seconds:02d}s"


def fmt_ratio(value: float) -> str:
    """A 0-1 ratio as a percentage with one decimal."""
    return f"{value * 100:.1f}%"


def bar(ratio: float, glyphs: Glyphs, width: int = BAR_WIDTH) -> str:
    """`ratio` of `width` cells filled, rounded to the nearest cell, clamped to [0, width]."""
    filled = min(max(round(ratio * width), 0), width)
    return glyphs.full * filled + glyphs.empty * (width - filled)


def _pressure_style(ratio: float) -> str:
    return "red" if ratio >= 0.9 else "yellow" if ratio >= 0.75 else "green"


def memory_cell(row: Row, glyphs: Glyphs) -> Text:
    """`[bar] in_use/limit`, or what is known; the reason when the endpoint is down."""
    if row.endpoint_down is not None:
        return Text(clip(row.endpoint_down, DOWN_CELL), style="red")
    if row.in_use is None:
        if row.live is not None:  # no allocator numbers (CPU devices): the workload's live arrays, and no limit
            return Text(f"{' ' * (BAR_WIDTH + 1)}{fmt_bytes(row.live)} live")
        return Text(glyphs.absent)
    if row.limit is None:
        return Text(f"{' ' * (BAR_WIDTH + 1)}{fmt_bytes(row.in_use)}/{glyphs.absent}")
    ratio = row.used_ratio or 0.0
    cell = Text(bar(ratio, glyphs), style=_pressure_style(ratio))
    cell.append(f" {fmt_bytes(row.in_use)}/{fmt_bytes(row.limit)}")
    return cell


def state_cell(row: Row, glyphs: Glyphs) -> Text:
    """Endpoint unreachable, probe down or up, memory read failing; a dash when the daemon does not say."""
    if row.endpoint_down is not None:
        return Text("unreachable", style="bold red")
    parts: list[Text] = []
    if row.up is not None:
        parts.append(Text("up", style="green") if row.up == 1 else Text("DOWN", style="bold red"))
    if row.read_ok == 0:
        parts.append(Text("read-error", style="red"))
    parts.extend(Text(f"{source}-down", style="yellow") for source in row.sources_down)
    if row.slowest:
        parts.append(Text("slowest", style="bold yellow"))
    return Text(" ").join(parts) if parts else Text(glyphs.absent)


def _num(value: float | None, fmt: str, glyphs: Glyphs) -> str:
    if value is None:
        return glyphs.absent
    return fmt_bytes(value) if fmt == "bytes" else fmt_ratio(value)


def _duty(row: Row, glyphs: Glyphs) -> str:
    if row.duty is None:
        return glyphs.absent
    return f"{fmt_ratio(row.duty)} {row.duty_source}" if row.duty_source else fmt_ratio(row.duty)


def _device_memory(row: Row, glyphs: Glyphs) -> str:
    used = _num(row.device_used, "bytes", glyphs)
    return used if row.device_total is None else f"{used}/{fmt_bytes(row.device_total)}"


def _place(platform: str, device: str, glyphs: Glyphs) -> str:
    if not device:
        return glyphs.absent
    return f"{platform}:{device}" if platform else device


def _rate(value: float | None, glyphs: Glyphs) -> str:
    """Per second, in k/M/G."""
    if value is None:
        return glyphs.absent
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _top_badput(row: Row, glyphs: Glyphs) -> str:
    """The largest badput kind and its share of the time, e.g. `eval 3.1%`."""
    if row.top_badput is None:
        return glyphs.absent
    kind, share = row.top_badput
    return f"{kind} {fmt_ratio(share)}"


@dataclass(frozen=True)
class Column:
    """One table column: its heading, the sort it stands for, its cell, and when it goes on a narrow screen."""

    heading: str
    sort: str | None
    cell: Callable[[Row, Glyphs], str | Text]
    drop_rank: int = 0  # 0: always shown; otherwise dropped on a narrow screen, highest rank first


COLUMNS = (
    Column("ENDPOINT", None, lambda r, g: r.key.endpoint),
    Column("DEVICE", "device", lambda r, g: _place(r.key.platform, r.key.device, g)),
    Column("WORKLOAD", None, lambda r, g: r.key.workload or g.absent),
    Column("MEMORY in use/limit", "memory", memory_cell),  # or "… live": live arrays where there is no allocator
    Column("RESERVED", None, lambda r, g: _num(r.reserved, "bytes", g), drop_rank=5),
    Column("FREE", "free", lambda r, g: _num(r.free, "bytes", g)),
    Column("FRAG", "fragmentation", lambda r, g: _num(r.fragmentation, "ratio", g), drop_rank=3),
    Column("ALLOCATABLE", None, lambda r, g: _num(r.allocatable, "bytes", g), drop_rank=5),
    Column("DEVICE MEM", None, _device_memory, drop_rank=6),
    Column("DUTY", "duty", _duty, drop_rank=2),
    Column("PROBE", None, lambda r, g: _num(r.probe, "ratio", g), drop_rank=4),
    Column("STEP", None, lambda r, g: g.absent if r.step is None else f"{r.step:.0f}", drop_rank=8),
    Column("STEP TIME", None, lambda r, g: g.absent if r.step_time is None else fmt_seconds(r.step_time), drop_rank=9),
    Column("LOSS", None, lambda r, g: g.absent if r.loss is None else f"{r.loss:.4g}", drop_rank=8),
    Column("MFU", None, lambda r, g: _num(r.mfu, "ratio", g), drop_rank=7),
    Column("GOODPUT", None, lambda r, g: _num(r.goodput, "ratio", g), drop_rank=10),
    Column("TOKENS/S", None, lambda r, g: _rate(r.tokens_per_second, g), drop_rank=11),
    Column("BADPUT", None, lambda r, g: _top_badput(r, g), drop_rank=12),
    Column("STATE", None, state_cell),
)


def _columns(rows: list[Row]) -> list[Column]:
    """Columns with something to show: WORKLOAD only with workloads, DEVICE MEM only with a device-wide source,
    RESERVED only where an allocator reports reservations."""
    hidden = set()
    if not any(r.key.workload for r in rows):
        hidden.add("WORKLOAD")
    if not any(r.step is not None for r in rows):
        hidden |= {"STEP", "STEP TIME"}
    hidden |= set() if any(r.loss is not None for r in rows) else {"LOSS"}
    if not any(r.mfu is not None for r in rows):
        hidden.add("MFU")
    if not any(r.goodput is not None for r in rows):
        hidden |= {"GOODPUT", "BADPUT"}
    if not any(r.tokens_per_second for r in rows):
        hidden.add("TOKENS/S")
    if not any(r.device_used is not None or r.device_total is not None for r in rows):
        hidden.add("DEVICE MEM")
    if not any(r.reserved is not None for r in rows):
        hidden.add("RESERVED")  # only an allocator with a stack (TPU) reports reservations
    return [c for c in COLUMNS if c.heading not in hidden]


def _build(rows: list[Row], columns: list[Column], sort: str, glyphs: Glyphs) -> Table:
    t = Table(box=box.SIMPLE_HEAD if glyphs is UNICODE else None, pad_edge=False, show_edge=False)
    for c in columns:
        t.add_column(c.heading + ("*" if c.sort == sort else ""), no_wrap=True, overflow="ellipsis")
    for cells in collapsed(rows, columns, glyphs):
        t.add_row(*cells)
    return t


def collapsed(rows: list[Row], columns: list[Column], glyphs: Glyphs) -> list[list[str | Text]]:
    """Each row's cells, where CPU devices of one endpoint and workload that show the same in every other column
    are one row, at the first one's place, its device `cpu:0-7` (N virtual CPU devices of one host read alike)."""
    out: list[list[str | Text]] = []
    first: dict[tuple[str, ...], int] = {}  # the other cells -> the row that holds them
    devices: dict[int, list[int]] = {}
    at = next((i for i, c in enumerate(columns) if c.heading == "DEVICE"), None)
    for r in rows:
        cells = [c.cell(r, glyphs) for c in columns]
        if at is None or r.key.platform != "cpu" or not r.key.device.isdigit():
            out.append(cells)
            continue
        same = (r.key.endpoint, r.key.workload, *(str(x) for i, x in enumerate(cells) if i != at))
        if same in first:
            devices[first[same]].append(int(r.key.device))
            continue
        first[same] = len(out)
        devices[len(out)] = [int(r.key.device)]
        out.append(cells)
    for index, ids in devices.items():
        if len(ids) > 1 and at is not None:
            out[index][at] = f"cpu:{_span(sorted(ids))}"
    return out


def _span(ids: list[int]) -> str:
    """Sorted ids as runs: 0-7, 0-4,6-7, 1,3."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def table(rows: list[Row], sort: str, glyphs: Glyphs, console: Console | None = None) -> Table:
    """The device table, rows in the order of `sort`; on a console too narrow for it, the least needed columns go."""
    ordered = sort_rows(rows, sort)
    columns = _columns(ordered)
    t = _build(ordered, columns, sort, glyphs)
    while console is not None:
        # Measured without the console's width limit, which would clamp the answer to it.
        if Measurement.get(console, console.options.update_width(1 << 20), t).maximum <= console.width:
            break
        droppable = [c for c in columns if c.drop_rank]
        if not droppable:
            break  # what is left is cut at the edge with an ellipsis per cell
        columns.remove(max(droppable, key=lambda c: c.drop_rank))
        t = _build(ordered, columns, sort, glyphs)
    return t


PROCESS_COLUMNS: tuple[tuple[str, Callable[[ProcessRow, Glyphs], str]], ...] = (
    ("ENDPOINT", lambda p, g: p.endpoint),
    ("DEVICE", lambda p, g: _place(p.platform, p.device, g)),
    ("PID", lambda p, g: p.pid),
    ("WORKLOAD", lambda p, g: p.workload or g.absent),
    ("DEVICE MEM", lambda p, g: fmt_bytes(p.used)),
)


def process_section(processes: list[ProcessRow], shown: int, glyphs: Glyphs) -> Group:
    """A blank line, then the `shown` largest processes as a table and a line counting the rest."""
    ordered = sort_processes(processes)
    t = Table(box=box.SIMPLE_HEAD if glyphs is UNICODE else None, pad_edge=False, show_edge=False)
    for heading, _ in PROCESS_COLUMNS:
        t.add_column(heading, no_wrap=True, overflow="ellipsis", justify="right" if heading == "DEVICE MEM" else "left")
    for p in ordered[:shown]:
        t.add_row(*(cell(p, glyphs) for _, cell in PROCESS_COLUMNS))
    parts: list[RenderableType] = [Text(""), t]
    hidden = len(ordered) - min(shown, len(ordered))
    if hidden:
        parts.append(Text(f"{hidden} more process{'' if hidden == 1 else 'es'} not shown", style="dim"))
    return Group(*parts)


JOB_COLUMNS: tuple[tuple[str, Callable[[JobProcess, Glyphs], str]], ...] = (
    ("PROCESS", lambda p, g: p.process_index),
    ("ENDPOINT", lambda p, g: p.endpoint),
    ("STEP", lambda p, g: g.absent if p.step is None else f"{p.step:.0f}"),
    ("DISPATCHED", lambda p, g: g.absent if p.dispatched is None else f"{p.dispatched:.0f}"),
    ("STEP TIME", lambda p, g: g.absent if p.step_time is None else fmt_seconds(p.step_time)),
    ("HOST WAIT", lambda p, g: _num(p.host_wait_ratio, "ratio", g)),
)


def job_section(found: list[Job], glyphs: Glyphs) -> Group:
    """Each stepping workload's processes across the endpoints, the slowest (most host wait) first and marked."""
    parts: list[RenderableType] = []
    for job in found:
        title = Text("")
        title.append(f"\njob {job.workload}", style="bold")
        count = len(job.processes)
        title.append(f": {count} process{'' if count == 1 else 'es'}")
        if job.median_step_time is not None:
            title.append(f", median step {fmt_seconds(job.median_step_time)}")
        if job.slowest is not None:
            title.append(
                f"; slowest: process {job.slowest.process_index} on {job.slowest.endpoint}, its devices wait for "
                f"its host {_num(job.slowest.host_wait_ratio, 'ratio', glyphs)} of the time",
                style="yellow",
            )
        t = Table(box=box.SIMPLE_HEAD if glyphs is UNICODE else None, pad_edge=False, show_edge=False)
        for heading, _ in JOB_COLUMNS:
            t.add_column(heading, no_wrap=True, overflow="ellipsis")
        t.add_column("")
        for p in job.processes[:JOB_ROWS]:
            mark = Text("slowest", style="bold yellow") if p is job.slowest else Text("")
            t.add_row(*(cell(p, glyphs) for _, cell in JOB_COLUMNS), mark)
        parts += [title, t]
        hidden = count - min(JOB_ROWS, count)
        if hidden:
            parts.append(Text(f"{hidden} more process{'' if hidden == 1 else 'es'} of {job.workload}", style="dim"))
    return Group(*parts)


def _lines(console: Console, renderable: RenderableType) -> int:
    return len(console.render_lines(renderable, console.options, pad=False))


def fitted_process_rows(console: Console, above: RenderableType, processes: list[ProcessRow], glyphs: Glyphs) -> int:
    """How many process rows fit on `console`'s screen below `above`, keeping a line to count the rest."""
    # The section with no rows is its blank line, heading and the "more" line: what any number of rows costs.
    room = console.height - _lines(console, above) - _lines(console, process_section(processes, 0, glyphs))
    return len(processes) if len(processes) <= room + 1 else max(room, 0)  # all shown: no "more" line needed


def header(
    states: list[EndpointState], now: float, stale_after: float, sort: str, interactive: bool, note: str = ""
) -> Text:
    """One line per endpoint (reachable, /healthz, failing collectors, device-wide sources), the key help and
    `note` (what the `t` key's trace did)."""
    out = Text()
    for s in states:
        reason = s.down_reason(now, stale_after)
        out.append(f"{s.name}  ", style="bold")
        if s.waiting(now, stale_after):
            out.append("connecting…", style="dim")
        elif reason is not None:
            out.append(f"DOWN: {reason}", style="bold red")
        else:
            out.append("healthy" if s.healthy else "UNHEALTHY", style="green" if s.healthy else "bold red")
            if s.health:
                out.append(f" ({s.health})")
            exp = s.exposition
            if exp is not None:
                failing = sorted(c for c, v in exp.collectors.items() if v != 1)
                if failing:
                    out.append(f"  failing collectors: {', '.join(failing)}", style="yellow")
                for source, (up, total) in sorted(exp.sources.items()):
                    if up == total:
                        out.append(f"  {source} up", style="green")
                    else:
                        out.append(f"  {source} down on {total - up} of {total} devices", style="yellow")
        out.append("\n")
    out.append(f"sort: {sort}", style="dim")
    out.append("   s: next sort   t: save a trace   q: quit" if interactive else "", style="dim")
    if note:
        out.append(f"\n{note}", style="bold")
    return out


def frame(
    states: list[EndpointState],
    sort: str,
    now: float,
    stale_after: float,
    glyphs: Glyphs,
    interactive: bool,
    console: Console | None = None,
    process_rows: int | None = ONCE_PROCESS_ROWS,
    note: str = "",
) -> Group:
    """Header, device table and process table, fitted to `console`'s width (and height when `process_rows` is None)."""
    rows = [r for s in states for r in s.rows(now, stale_after)]
    found = jobs(rows)
    slow = {(j.slowest.endpoint, j.workload, j.slowest.process_index) for j in found if j.slowest is not None}
    for r in rows:
        r.slowest = (r.key.endpoint, r.key.workload, r.process_index) in slow
    top = Group(header(states, now, stale_after, sort, interactive, note), table(rows, sort, glyphs, console))
    if found:
        top = Group(top, job_section(found, glyphs))
    processes = [p for s in states for p in s.processes(now, stale_after)]
    if not processes:  # no endpoint exports any (no NVML, or nothing runs): no process table at all
        return top
    if process_rows is None:
        process_rows = ONCE_PROCESS_ROWS if console is None else fitted_process_rows(console, top, processes, glyphs)
    return Group(top, process_section(processes, process_rows, glyphs))
