"""What every command-line tool shares: the reference's flags, config loading
with errors that exit 2, logging on stderr, signals and the tower watch.

The reference's tools take ``-c FILE`` (a ZPL config), ``--pub ADDR``,
``--sub ADDR`` and ``--verbose``; flags override the file.  On top of that
every tool takes kcat-style ``-X/--set key=value`` (repeatable).  Precedence:
defaults, then the file, then ``-X``, then the dedicated flags.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import click

from dafka.config import Config, ConfigError, parse_override

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# Exit codes (documented in README "Command-line tools").
EXIT_OK = 0
EXIT_FAILURE = 1  # runtime failure: records left unacked, database locked, no tower for `status`
EXIT_USAGE = 2  # bad flag or config (click's UsageError)
EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143

_SAID_BY_TOOL = {
    "dafka.discovery.beacon": "%s %s: no tower answers",
    "dafka.producer.producer": "producer %s closed with %d records unacked (terminate_unacked)",
}


# --------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------


def parse_sets(ctx: click.Context, param: click.Parameter, values: Iterable[str]) -> list[tuple[str, str]]:
    pairs = []
    for text in values or ():
        try:
            pairs.append(parse_override(text))
        except ConfigError as exc:
            raise click.BadParameter(config_reason(exc), ctx=ctx, param=param) from None
    return pairs


def config_reason(exc: ConfigError) -> str:
    """``str(exc)`` without the 'command line' pseudo-file."""
    if exc.file == "command line":
        parts = [p for p in (exc.key, exc.reason) if p]
        return ": ".join(parts)
    return str(exc)


def common_options(*, pub_help: str, sub_help: str, tower_timeout: bool = True, metrics: bool = False) -> Callable:
    """The reference's flags (-c, --pub, --sub, --verbose) plus -X/--set and,
    for peers, --tower-timeout-ms; with ``metrics``, --metrics-port and
    --metrics-address."""

    def decorate(f: Callable) -> Callable:
        options = [
            click.option("-c", "--config", "config_path", metavar="FILE",
                         help="Config file in the reference's ZPL format."),
            click.option("--pub", metavar="ADDR", help=pub_help),
            click.option("--sub", metavar="ADDR", help=sub_help),
            click.option("-X", "--set", "sets", metavar="KEY=VALUE", multiple=True, callback=parse_sets,
                         help="Set any config key (repeatable), e.g. -X beacon/address=127.0.0.1."),
            click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr (and */verbose = 1)."),
        ]
        if tower_timeout:
            options.append(click.option(
                "--tower-timeout-ms", type=click.IntRange(min=0), default=3000, show_default=True,
                metavar="MS", help="Warn on stderr when no tower has answered after this long."))
        if metrics:
            options.append(click.option(
                "--metrics-port", type=click.IntRange(1, 65535), metavar="PORT",
                help="Serve Prometheus metrics at http://ADDRESS:PORT/metrics (dafka_... counters and gauges; "
                     "README lists them)."))
            options.append(click.option(
                "--metrics-address", default="127.0.0.1", show_default=True, metavar="ADDRESS",
                help="The interface --metrics-port listens on (0.0.0.0: every one)."))
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def load_config(
    config_path: str | None,
    sets: list[tuple[str, str]],
    flags: Mapping[str, tuple[str, object]],
    verbose_keys: Iterable[str] = (),
    verbose: bool = False,
) -> Config:
    """Defaults, then the file, then -X, then the dedicated ``flags``
    (``{key: (flag name, value)}``; None values are skipped).  Any
    :class:`ConfigError` becomes a click usage error (exit 2) naming the
    file, line and key."""
    try:
        config = Config.load(config_path)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="'-c' / '--config'") from None
    if sets:
        try:
            config = config.with_overrides(dict(sets), source="-X/--set")
        except ConfigError as exc:
            raise click.BadParameter(config_reason(exc), param_hint="'-X' / '--set'") from None
    for key, (flag, value) in flags.items():
        if value is None:
            continue
        try:
            config = config.with_overrides({key: value}, source=flag)
        except ConfigError as exc:
            raise click.BadParameter(f"{key}: {exc.reason}", param_hint=f"'{flag}'") from None
    if verbose:
        config = config.with_overrides({k: True for k in verbose_keys}, source="--verbose")
    return config


# --------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------


class _DropSaidByTool(logging.Filter):
    """Log lines the tools replace with their own words on stderr: the
    beacon repeats 'no tower answers' every 10 s (the tools say it once, after
    --tower-timeout-ms) and the producer's terminate_unacked warning (the
    console producer's summary says it).  Shown with --verbose."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.prefix))


_handler: logging.Handler | None = None


def setup_logging(verbose: bool) -> None:
    """``dafka`` logs to stderr (never stdout): WARNING, or DEBUG when verbose."""
    global _handler
    logger = logging.getLogger("dafka")
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(_handler)
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING)
    for name, prefix in _SAID_BY_TOOL.items():
        child = logging.getLogger(name)
        for f in [f for f in child.filters if isinstance(f, _DropSaidByTool)]:
            child.removeFilter(f)
        if not verbose:
            child.addFilter(_DropSaidByTool(prefix))


def prog_name() -> str:
    """How the user invoked us: ``dafka_console_consumer`` or ``dafka consume``."""
    ctx = click.get_current_context(silent=True)
    return ctx.command_path if ctx is not None else os.path.basename(sys.argv[0])


def say(message: str) -> None:
    """One line on stderr, prefixed with the program name."""
    click.echo(f"{prog_name()}: {message}", err=True)


# --------------------------------------------------------------------------
# Signals
# --------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM in a client tool; ``code`` is the exit status."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.code = 128 + signum


def _exit_now(signum: int, frame: object) -> None:
    os._exit(128 + signum)


def _second_signal_exits() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_now)


def raise_on_signals() -> None:
    """Clients: the first SIGINT/SIGTERM raises :class:`Interrupted` in the
    main thread (so the tool can close cleanly), a second one exits at once."""

    def handler(signum: int, frame: object) -> None:
        _second_signal_exits()
        raise Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def stop_event_on_signals(*callbacks: Callable[[], None]) -> threading.Event:
    """Daemons: the first SIGINT/SIGTERM sets the returned event and calls
    ``callbacks`` (clean shutdown), a second one exits at once."""
    stop = threading.Event()
    stop.callbacks = list(callbacks)  # type: ignore[attr-defined]

    def handler(signum: int, frame: object) -> None:
        _second_signal_exits()
        stop.set()
        for callback in stop.callbacks:  # type: ignore[attr-defined]
            callback()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    return stop


def run_or_exit(run: Callable[[], None], what: str, expected: tuple[type[Exception], ...] = ()) -> None:
    """A daemon's loop: a failure is one line on stderr (an ``expected`` error
    says its message alone, any other its type too) and exit 1; the
    traceback goes to the debug log."""
    try:
        run()
    except expected as exc:
        say(str(exc))
        sys.exit(EXIT_FAILURE)
    except Exception as exc:
        say(f"{type(exc).__name__}: {exc}")
        logging.getLogger("dafka.cli").debug("%s failed", what, exc_info=True)
        sys.exit(EXIT_FAILURE)


# --------------------------------------------------------------------------
# The tower watch
# --------------------------------------------------------------------------


class TowerWatch:
    """Say once on stderr when no tower has answered after ``timeout_ms``;
    the peer itself keeps trying."""

    def __init__(self, connected: Callable[[], bool], address: str, timeout_ms: int) -> None:
        self._connected = connected
        self._address = address
        self._prog = prog_name()
        self._timer = threading.Timer(max(timeout_ms, 1) / 1000.0, self._check)
        self._timer.name = "cli-tower-watch"
        self._timer.daemon = True
        self.warned = False

    def start(self) -> "TowerWatch":
        self._timer.start()
        return self

    def cancel(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        if not self._connected():
            self.warned = True
            click.echo(f"{self._prog}: no tower answers at {self._address}; still trying", err=True)


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [headers, *rows]:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return lines


def exit_on_interrupt(f: Callable) -> Callable:
    """Wrap a client command: an :class:`Interrupted` that escapes (a signal
    before the tool could set up) exits 130/143 without a traceback."""
    import functools

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except Interrupted as exc:
            sys.exit(exc.code)

    return wrapper


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------


def serve_metrics(port: int | None, address: str) -> Any:
    """With ``--metrics-port``: serve Prometheus metrics, before any peer
    starts (a port in use fails the tool at once); returns the collector to
    ``add`` the peers to, or None without the flag."""
    if port is None:
        return None
    from dafka import metrics

    try:
        metrics.serve(port, address)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise click.BadParameter(f"cannot serve metrics at {address}:{port}: {reason}",
                                 param_hint="'--metrics-port' / '--metrics-address'") from None
    return metrics.register()
