"""Alembic's entry: migrations run on the store's connection, in the runner's transaction
(`store/migrate.py`)."""

from alembic import context

from sentinel.coordinator.store.schema import metadata

context.configure(connection=context.config.attributes["connection"], target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()
