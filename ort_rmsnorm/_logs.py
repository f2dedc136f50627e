"""Quieting the loggers of the libraries the tools drive."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quieted(logger_name: str, level: int) -> Iterator[None]:
    """Raises the logger's level to ``level`` for the block, then puts it back."""
    logger = logging.getLogger(logger_name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)
