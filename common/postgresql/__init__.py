"""Django's PostgreSQL backend, asking first the host that served last (``base``)."""
