import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
os.environ.setdefault("DATABASE_POOL", "1")  # a thread per request: see settings.DATABASES
application = get_asgi_application()
