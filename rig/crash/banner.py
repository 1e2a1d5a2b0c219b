"""Imported first by the forkserver that starts warm workers (`case._context`): pipecat logs
its banner when imported, and the forkserver writes to the terminal of whoever started the
cases (the demo printed it twice). Each worker turns pipecat's logging back on in its own log
file (`case._worker_entry`)."""

from loguru import logger

logger.disable("pipecat")
