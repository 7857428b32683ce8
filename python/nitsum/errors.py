"""Errors a user of the engine can get, each naming what was wrong."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request was rejected before touching the engine; `field` names the bad input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
