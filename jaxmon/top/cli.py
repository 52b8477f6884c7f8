"""`jaxmon top`'s command line: arguments, --once, and the live loop (keys, resize, signals)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from rich.console import Console
from rich.live import Live

from jaxmon.settings.durations import parse_duration
from jaxmon.top.fetch import DEFAULT_URL, ClientConfig, EndpointError, Poller, metrics_url
from jaxmon.top.rows import SORT_NAMES, next_sort
from jaxmon.top.trace import TRACE_KEYS, TraceSaver
from jaxmon.top.view import ASCII, UNICODE, frame

PROG = "jaxmon top"
PASSWORD_ENV = "JAXMON_TOP_PASSWORD"
QUIT_KEYS = frozenset("qQ")
SORT_KEYS = frozenset("sS")
PLAIN_WIDTH = 4096  # piped output is not cut to any terminal: scripts get whole rows


class UsageError(ValueError):
    """Bad arguments: the message names the option and what is wrong."""


def _duration(text: str) -> float:
    try:
        seconds = float(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return seconds


def parser() -> argparse.ArgumentParser:
    """The `jaxmon top` arguments."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Live per-device view of running jaxmon endpoints. Keys: s cycles the sort, q quits.",
        epilog=f"Basic auth: --user, with the password from --password-file or ${PASSWORD_ENV}.",
    )
    p.add_argument("urls", nargs="*", metavar="URL", help=f"metrics URL, host:port or host (default {DEFAULT_URL})")
    p.add_argument("--interval", type=_duration, default=1.0, help="refresh every (default 1s)")
    p.add_argument("--timeout", type=_duration, default=2.0, help="per request (default 2s)")
    p.add_argument("--sort", choices=SORT_NAMES, default="device", help="initial sort (default device)")
    p.add_argument("--once", action="store_true", help="print one frame to stdout and exit (plain text when piped)")
    p.add_argument("--ca-file", type=Path, help="CA certificate(s) to trust for https endpoints")
    p.add_argument("--cert-file", type=Path, help="client certificate for endpoints that require one (mTLS)")
    p.add_argument("--key-file", type=Path, help="key of --cert-file")
    p.add_argument("--user", help="basic auth user")
    p.add_argument("--password-file", type=Path, help="file holding the basic auth password")
    return p


def client_config(args: argparse.Namespace) -> ClientConfig:
    """The client settings, checked: files must be readable, a password needs a user."""
    for option in ("ca_file", "cert_file", "key_file", "password_file"):
        path: Path | None = getattr(args, option)
        if path is not None and not path.is_file():
            raise UsageError(f"--{option.replace('_', '-')} {path}: no such file")
    if args.password_file is not None and args.user is None:
        raise UsageError("--password-file needs --user")
    if args.key_file is not None and args.cert_file is None:
        raise UsageError("--key-file needs --cert-file")
    password = os.environ.get(PASSWORD_ENV)
    if args.password_file is not None:
        password = args.password_file.read_text().rstrip("\r\n")
    return ClientConfig(args.timeout, args.ca_file, args.cert_file, args.key_file, args.user, password)


def stale_after(interval: float, timeout: float) -> float:
    """How long without a good answer before an endpoint whose fetch hangs counts as down."""
    return interval + 2 * timeout + 1.0


def once(poller: Poller, sort: str, interval: float, timeout: float, out: TextIO) -> int:
    """One frame on `out`; colour and box drawing only when it is a terminal. Exit 1 when an endpoint is down."""
    poller.scrape_all_once()
    states = poller.snapshot()
    tty_out = out.isatty()
    now, limit = time.monotonic(), stale_after(interval, timeout)
    if tty_out:
        console = Console(file=out, highlight=False)
        console.print(frame(states, sort, now, limit, UNICODE, False, console))
    else:  # plain text for scripts: no colour, ASCII, every column, one line per row, no trailing blanks
        buffer = io.StringIO()
        console = Console(file=buffer, highlight=False, width=PLAIN_WIDTH, force_terminal=False, no_color=True)
        console.print(frame(states, sort, now, limit, ASCII, False))
        out.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))
    return 1 if any(s.down_reason(now, stale_after(interval, timeout)) for s in states) else 0


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Keys arrive one at a time without echo; the terminal's settings come back however the block ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextmanager
def wake_pipe() -> Iterator[tuple[int, int]]:
    """A pipe that SIGWINCH and finished scrapes write to, so the loop redraws at once; SIGTERM/SIGHUP quit."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)

    def wake(signum: int, frame: FrameType | None) -> None:
        _poke(w)

    def quit_(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)  # unwinds through cbreak() and Live, which restore the terminal

    saved = {sig: signal.signal(sig, handler) for sig, handler in ((signal.SIGWINCH, wake), (signal.SIGTERM, quit_))}
    saved[signal.SIGHUP] = signal.signal(signal.SIGHUP, quit_)
    try:
        yield r, w
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        os.close(r)
        os.close(w)


def interactive(poller: Poller, sort: str, interval: float, timeout: float) -> int:
    """Redraw every `interval`, on each finished scrape and on resize; `s` cycles the sort, `t` saves a trace of
    the first endpoint's job to the working directory, `q` quits."""
    stdin = sys.stdin.fileno()
    # rich takes $COLUMNS/$LINES over the terminal's size and would then never follow a resize (rich console.py).
    for var in ("COLUMNS", "LINES"):
        os.environ.pop(var, None)
    console = Console(highlight=False)
    limit = stale_after(interval, timeout)
    with wake_pipe() as (wake_r, wake_w), cbreak(stdin):
        poller.on_change = lambda: _poke(wake_w)
        tracer = TraceSaver(poller.states[0].url, poller.config, Path.cwd(), lambda: _poke(wake_w))
        with Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False) as live:
            poller.start()
            next_draw = 0.0
            redraw = True
            while True:
                now = time.monotonic()
                if redraw or now >= next_draw:
                    # process_rows=None: as many processes as fit below the devices, on this screen's height
                    shown = frame(
                        poller.snapshot(), sort, now, limit, UNICODE, True, console, process_rows=None, note=tracer.note
                    )
                    live.update(shown, refresh=True)
                    next_draw, redraw = now + interval, False
                ready, _, _ = select.select([stdin, wake_r], [], [], max(next_draw - time.monotonic(), 0.0))
                if wake_r in ready:
                    _drain(wake_r)
                    redraw = True
                if stdin in ready:
                    keys = os.read(stdin, 64).decode("utf-8", "replace")
                    if not keys or QUIT_KEYS & set(keys):  # EOF on stdin counts as quit
                        poller.stop()
                        return 0
                    for _ in range(sum(k in SORT_KEYS for k in keys)):
                        sort = next_sort(sort)
                        redraw = True
                    if TRACE_KEYS & set(keys):
                        tracer.start()
                        redraw = True


def _poke(fd: int) -> None:
    with contextlib.suppress(OSError):  # full (a redraw is due anyway) or closed (quitting)
        os.write(fd, b".")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def main(argv: Sequence[str]) -> int:
    """Entry point of `jaxmon top`."""
    args = parser().parse_args(list(argv))
    try:
        urls = [metrics_url(u) for u in (args.urls or [DEFAULT_URL])]
        config = client_config(args)
        poller = Poller(urls, config, args.interval)
    except (UsageError, EndpointError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.once:
        return once(poller, args.sort, args.interval, args.timeout, sys.stdout)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            f"{PROG}: stdin and stdout must be a terminal for the live view; use --once to print one frame",
            file=sys.stderr,
        )
        return 2
    try:
        return interactive(poller, args.sort, args.interval, args.timeout)
    except KeyboardInterrupt:
        return 0
    finally:
        poller.stop()
