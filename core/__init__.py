"""core: the ground every app may import, and that imports no app of the
project. For now it records how each background job (a Celery task, and
the beat entry that sent it) last ended, so finance and Prometheus can see
a scheduled job that stopped running."""
