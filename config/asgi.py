import os

from django.core.asgi import get_asgi_application

from core.heap import web_app_heap_freeze

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
os.environ.setdefault("DATABASE_POOL", "1")  # a thread per request: see settings.DATABASES
application = get_asgi_application()
web_app_heap_freeze()  # no full collection walks Django and the views again
