import os

from django.core.wsgi import get_wsgi_application

from core.heap import web_app_heap_freeze

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
application = get_wsgi_application()
web_app_heap_freeze()  # no full collection walks Django and the views again
