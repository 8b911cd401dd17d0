"""One structlog setup for every TauGrid process: JSON in production, console on a TTY."""

from __future__ import annotations

import logging
import sys

import structlog


def setup(component: str, *, level: str = "INFO", json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger once per process.

    `json=None` picks JSON unless stderr is a terminal, so production logs are machine
    readable and a developer's shell stays legible.
    """
    use_json = (not sys.stderr.isatty()) if json is None else json
    shared_processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            *shared_processors,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    structlog.contextvars.bind_contextvars(component=component)
