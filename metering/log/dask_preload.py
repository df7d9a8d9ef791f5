"""Preloaded by every Dask worker of the scaled path (`dask worker
--preload metering.log.dask_preload`): the project's modules need Django
set up before they are imported. Workers compute only; they never touch
the database."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
django.setup()
