"""The quota store: SQLAlchemy models, engine set-up, Alembic migrations and idempotent writes."""
