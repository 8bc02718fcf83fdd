"""The exception a route raises to answer JSON `{code, message}` (errors.py renders it). A
module of its own so that auth.py, which errors.py uses, can raise it too."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
