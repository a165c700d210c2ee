"""PostgresUpdateStore (placeholder until implemented)."""

__all__ = ["PostgresUpdateStore", "postgres_update_store_schema"]


class PostgresUpdateStore:  # pragma: no cover - placeholder
    """Not implemented yet."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError


def postgres_update_store_schema(table: str = "telegram_updates") -> str:  # pragma: no cover
    """Not implemented yet."""
    raise NotImplementedError
