"""The ``sqlite:///`` URL and its options, checked into one :class:`Settings` value.

``sqlite:///loom.db`` is a path relative to the working directory and
``sqlite:////var/lib/loom.db`` an absolute one (three slashes, then the path: the
SQLAlchemy convention). Options come from the URL's query string
(``?synchronous=FULL&busy_timeout_ms=10000``) or from ``open_storage(options=…)``, never
both for one name. Every refusal is an :class:`~loom_core.errors.InvalidURLError` or
:class:`~loom_core.errors.InvalidOptionError` that names the option and what it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, TypeAlias, cast
from urllib.parse import parse_qsl, unquote

from loom_core.errors import InvalidOptionError, InvalidURLError

__all__ = ["Clock", "OPTION_NAMES", "Settings", "Synchronous", "parse_settings"]

Synchronous: TypeAlias = Literal["NORMAL", "FULL"]
Clock: TypeAlias = Callable[[], datetime]

PREFIX: Final = "sqlite:///"
DEFAULT_BUSY_TIMEOUT_MS: Final = 5_000
DEFAULT_SUBSCRIBE_POLL_MS: Final = 50
MAX_MS: Final = 24 * 3600 * 1000

OPTION_NAMES: Final = ("synchronous", "busy_timeout_ms", "subscribe_poll_ms", "clock")
_URL_OPTIONS: Final = frozenset(OPTION_NAMES) - {"clock"}


@dataclass(frozen=True, slots=True)
class Settings:
    """A checked SQLite storage configuration.

    ``synchronous``: ``NORMAL`` (default; a power loss can lose the last commits, a
    process crash never does) or ``FULL`` (every commit reaches the disk first).
    ``busy_timeout_ms``: how long a write waits for another process's write lock before
    :class:`~loom_sqlite.errors.DatabaseBusyError`. ``subscribe_poll_ms``: how often
    ``subscribe`` looks for commits made by other processes. ``clock``: the store clock
    (``recorded_at``, lease expiry); ``None`` is the host clock.
    """

    path: str
    synchronous: Synchronous = "NORMAL"
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    subscribe_poll_ms: int = DEFAULT_SUBSCRIBE_POLL_MS
    clock: Clock | None = None


def _path_of(url: str) -> tuple[str, str]:
    if url[: len(PREFIX)].lower() != PREFIX:
        if url[:9].lower() == "sqlite://":
            raise InvalidURLError(
                f"SQLite URL {url!r} names a host; SQLite files are local: use "
                "sqlite:///relative/path.db or sqlite:////absolute/path.db"
            )
        raise InvalidURLError(f"{url!r} is not a sqlite:/// URL")
    rest = url[len(PREFIX) :]
    if "#" in rest:
        raise InvalidURLError(f"SQLite URL {url!r} has a fragment ('#...'); remove it")
    raw_path, _, query = rest.partition("?")
    try:
        # Strictly: unquote's default reads bytes that are not UTF-8 as U+FFFD, so that
        # %FF and %FE would both open the one file named with it.
        path = unquote(raw_path, errors="strict")
    except UnicodeDecodeError:
        raise InvalidURLError(
            f"SQLite URL {url!r} has a path whose percent-encoded bytes are not UTF-8 "
            "text; encode the file name's UTF-8 bytes (a space is %20, é is %C3%A9)"
        ) from None
    if not path or path.endswith("/"):
        raise InvalidURLError(
            f"SQLite URL {url!r} names no file; use e.g. sqlite:///loom.db or "
            "sqlite:////var/lib/loom/loom.db"
        )
    if path == ":memory:" or path.startswith("file:"):
        raise InvalidURLError(
            f"SQLite URL {url!r}: loom-sqlite needs a file path (several processes share "
            "it); for an in-process store use memory://"
        )
    if "\x00" in path:
        raise InvalidURLError(f"SQLite URL {url!r} contains a NUL character")
    try:
        path.encode("utf-8")  # what SQLite opens a file by
    except UnicodeEncodeError:
        raise InvalidURLError(
            f"SQLite URL {url!r} has a path that is not UTF-8 text (a lone surrogate)"
        ) from None
    return path, query


def _url_options(url: str, query: str) -> dict[str, object]:
    if not query:
        return {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError as exc:
        raise InvalidURLError(f"SQLite URL {url!r} has a malformed query string: {exc}") from None
    options: dict[str, object] = {}
    for name, value in pairs:
        if name not in _URL_OPTIONS:
            raise InvalidOptionError(
                f"unknown sqlite:/// URL option {name!r}; known: {', '.join(sorted(_URL_OPTIONS))}"
            )
        if name in options:
            raise InvalidOptionError(f"sqlite:/// URL option {name!r} is given twice")
        options[name] = _whole_number(name, value) if name in _MS_OPTIONS else value
    return options


# A URL carries text, so its numbers are parsed here; options= must pass real ints, like
# every other option of the wrong type is refused.
_MS_OPTIONS: Final = frozenset({"busy_timeout_ms", "subscribe_poll_ms"})


def _whole_number(name: str, text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise InvalidOptionError(
            f"{name} in the URL must be a whole number of milliseconds, got {text!r}"
        ) from None


def _milliseconds(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionError(
            f"{name} must be an int (milliseconds), not {type(value).__name__}"
        )
    if not minimum <= value <= MAX_MS:
        raise InvalidOptionError(f"{name} must be between {minimum} and {MAX_MS}, got {value}")
    return value


def _synchronous(value: object) -> Synchronous:
    if not isinstance(value, str):
        raise InvalidOptionError(f"synchronous must be a str, not {type(value).__name__}")
    upper = value.upper()
    if upper == "NORMAL":
        return "NORMAL"
    if upper == "FULL":
        return "FULL"
    raise InvalidOptionError(
        f"synchronous must be 'NORMAL' or 'FULL', got {value!r}: OFF could lose commits on "
        "a process crash and EXTRA adds nothing in WAL mode"
    )


def parse_settings(url: object, options: Mapping[str, object]) -> Settings:
    """Check ``url`` and ``options``; refuse an unknown option or one given twice."""
    if not isinstance(url, str):
        raise InvalidURLError(f"storage URL must be a str, not {type(url).__name__}")
    if not isinstance(options, Mapping):
        raise InvalidOptionError(f"options must be a mapping, not {type(options).__name__}")
    path, query = _path_of(url)
    merged = _url_options(url, query)
    for name, value in options.items():
        if name not in OPTION_NAMES:
            raise InvalidOptionError(
                f"unknown sqlite:/// option {name!r}; known: {', '.join(OPTION_NAMES)}"
            )
        if name in merged:
            raise InvalidOptionError(
                f"sqlite:/// option {name!r} is given both in the URL and in options; "
                "give it once"
            )
        merged[name] = value
    clock = merged.get("clock")
    if clock is not None and not callable(clock):
        raise InvalidOptionError("clock must be a callable returning an aware datetime")
    return Settings(
        path=path,
        synchronous=_synchronous(merged.get("synchronous", "NORMAL")),
        busy_timeout_ms=_milliseconds(
            "busy_timeout_ms", merged.get("busy_timeout_ms", DEFAULT_BUSY_TIMEOUT_MS), 0
        ),
        subscribe_poll_ms=_milliseconds(
            "subscribe_poll_ms", merged.get("subscribe_poll_ms", DEFAULT_SUBSCRIBE_POLL_MS), 1
        ),
        clock=cast(Clock | None, clock),
    )
