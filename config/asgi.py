import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
os.environ.setdefault("DATABASE_POOL", "1")  # a thread per request: see settings.DATABASES
application = get_asgi_application()


def _startup_heap_frozen() -> None:
    """Load what Django loads on a worker's first request (the URLconf,
    every view and serializer it names), then keep it all out of the
    collector's full passes (core.heap): otherwise each one pauses the
    worker for every request it is serving."""
    from django.urls import get_resolver

    from core.heap import startup_heap_freeze

    get_resolver().url_patterns  # noqa: B018 (imports the URLconf)
    startup_heap_freeze()


_startup_heap_frozen()
