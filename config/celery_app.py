"""The Celery app. Tasks are discovered in every installed app's tasks.py;
the beat schedule lives in the database (django-celery-beat) and is declared
in one place, config/schedule.py."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("gpu_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
