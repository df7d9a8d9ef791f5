"""Celery tasks for the fleet: thin, safe to run twice."""

from celery import shared_task

from serving.scraper import replicas_scrape_all


@shared_task(name="serving.replicas_scrape", time_limit=60, soft_time_limit=50, ignore_result=True)
def replicas_scrape_task() -> int:
    """Every 15 s (config/schedule.py): each replica's /metrics into samples."""
    return replicas_scrape_all()
