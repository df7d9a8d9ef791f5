from django.urls import path

from dashboard import jobs, views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("jobs/", jobs.jobs_page, name="jobs"),
]
