"""Every scheduled job names a registered Celery task; the replica scrape
runs every 15 seconds."""

from django.conf import settings

from config.celery_app import app


def test_beat_schedule_names_registered_tasks():
    app.loader.import_default_modules()
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["replicas-scrape"] == {"task": "serving.replicas_scrape", "schedule": 15.0}
    for entry in schedule.values():
        assert entry["task"] in app.tasks, entry["task"]
