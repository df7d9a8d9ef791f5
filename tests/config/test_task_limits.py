"""Every registered task can be sent: its soft time limit is below its hard
one (Celery refuses to send a task whose hard limit is under the global
soft limit), and a message carrying the options beat uses is accepted by
the same code that publishes to the broker."""

from __future__ import annotations

import inspect

import pytest
from celery.beat import ScheduleEntry, Scheduler
from kombu import Connection

from config.celery_app import app
from config.schedule import BEAT_SCHEDULE


def _tasks() -> dict:
    app.loader.import_default_modules()
    return {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}


def _placeholder_args(task) -> list:
    """One value per required positional parameter: the message is only
    published (to an in-memory broker), never run."""
    params = inspect.signature(task.run).parameters.values()
    return [
        0
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def _limits(task) -> tuple[float, float]:
    soft = task.soft_time_limit or app.conf.task_soft_time_limit
    hard = task.time_limit or app.conf.task_time_limit
    return soft, hard


@pytest.mark.parametrize("name", sorted(_tasks()))
def test_every_task_has_a_soft_limit_below_its_hard_limit(name):
    task = app.tasks[name]
    assert task.soft_time_limit, f"{name}: no explicit soft_time_limit"
    soft, hard = _limits(task)
    assert 0 < soft < hard, f"{name}: soft {soft} s, hard {hard} s"


@pytest.mark.parametrize("name", sorted(_tasks()))
def test_every_task_can_be_published(name):
    task = app.tasks[name]
    with Connection("memory://") as conn:
        task.apply_async(args=_placeholder_args(task), connection=conn)


@pytest.mark.parametrize("entry_name", sorted(BEAT_SCHEDULE))
def test_beat_can_send_every_scheduled_entry(entry_name):
    """Through celery.beat's own apply_async (which turns any send error
    into "Couldn't apply scheduled task ...")."""
    app.loader.import_default_modules()
    spec = BEAT_SCHEDULE[entry_name]
    entry = ScheduleEntry(
        name=entry_name,
        task=spec["task"],
        schedule=spec["schedule"],
        args=spec.get("args", ()),
        kwargs=spec.get("kwargs", {}),
        options=spec.get("options", {}),
        app=app,
    )
    scheduler = Scheduler(app, schedule={}, lazy=True)
    with Connection("memory://") as conn:
        producer = app.amqp.Producer(conn, auto_declare=False)
        assert scheduler.apply_async(entry, producer=producer, advance=False).id
