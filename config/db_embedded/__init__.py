"""Django database backend: PostgreSQL, embedded, started on first connection."""
