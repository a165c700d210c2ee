"""One pool for the bot and the application: the store borrows the application's engine."""

import sqlalchemy as sa

from ptb_fence import PostgresUpdateStore


def open_store(url: str) -> PostgresUpdateStore:
    """The application's engine, and a store that borrows up to 4 of its 10 connections."""
    engine = sa.create_engine(url, pool_size=10)  # url: "postgresql+psycopg2://bot@db/bot"
    return PostgresUpdateStore(engine, pool_size=4)
