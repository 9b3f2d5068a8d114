"""``Closeable``: the context-manager face of the objects that hold a resource until closed."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self


class Closeable:
    """A context manager that calls ``close()`` on the way out."""

    def close(self) -> None:
        """Releases what the object holds. Idempotent."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
