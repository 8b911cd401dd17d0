"""`taugrid-agent`: settings from the environment, structlog, graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import pydantic

from agent import app, settings
from shared import logs


async def _run(config: settings.Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.serve(config, stop)


def main() -> int:
    """Run the agent until SIGTERM/SIGINT; exit 2 on invalid settings, naming the field."""
    try:
        config = settings.Settings()
    except pydantic.ValidationError as err:
        for problem in err.errors():
            field = ".".join(str(p) for p in problem["loc"])
            print(
                f"invalid setting TAUGRID_AGENT_{field.upper()}: {problem['msg']}", file=sys.stderr
            )
        return 2
    logs.setup("agent", level=config.log_level, json=config.log_json)
    asyncio.run(_run(config))
    return 0
