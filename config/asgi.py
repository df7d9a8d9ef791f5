import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from core.asgi_limits import BodyLimit
from core.heap import web_app_heap_freeze

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
os.environ.setdefault("DATABASE_POOL", "1")  # a thread per request: see settings.DATABASES
# Bodies bounded at the server, before Django reads them (core.asgi_limits).
application = BodyLimit(get_asgi_application(), max_bytes=settings.WEB_MAX_BODY_BYTES)
web_app_heap_freeze()  # no full collection walks Django and the views again
