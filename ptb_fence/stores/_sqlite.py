"""SQLiteUpdateStore (placeholder until implemented)."""

__all__ = ["SQLiteUpdateStore"]


class SQLiteUpdateStore:  # pragma: no cover - placeholder
    """Not implemented yet."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError
