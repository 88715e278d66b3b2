"""What the subcommands share: logging setup for command-line runs."""

from __future__ import annotations

import logging
import os


def setup_logging() -> None:
    """INFO logs to stderr (WARNING only on ranks other than 0 under torchrun)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if int(os.environ.get("RANK", "0")) != 0:
        logging.getLogger("effiformer").setLevel(logging.WARNING)
