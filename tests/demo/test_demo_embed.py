"""The demo's embedding model: tiny-embed served beside the tiny model in the
shared pool, on a GPU of its own, priced in every demo book so a tenant
held to a budget may call it too; seeded once, however often `up` runs."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from billing.models import ModelPrice
from demo.seeds.billing import DEMO_EMBED_PER_MTOK, embed_prices_demo_seed, prices_demo_seed
from demo.seeds.fleet import DEMO_EMBED_REPLICA, embed_demo_seed, fleet_demo_seed
from serving.choices import ModelTask, ReplicaStatus
from serving.models import Replica
from serving.tiny_model import EMBEDDING_MODEL_NAME

pytestmark = pytest.mark.django_db


def _seed(tmp_path) -> None:
    call_command("seed_demo", secrets_file=tmp_path / "keys.json", stdout=io.StringIO())
    prices_demo_seed()
    fleet_demo_seed()
    embed_demo_seed()
    embed_prices_demo_seed()


def test_tiny_embed_is_seeded_once_as_an_embedding_model_and_priced(tmp_path):
    _seed(tmp_path)
    _seed(tmp_path)  # `up` again: nothing more
    replica = Replica.objects.select_related("model", "pool").get(name=DEMO_EMBED_REPLICA)
    assert (replica.model.name, replica.model.task) == (EMBEDDING_MODEL_NAME, ModelTask.EMBED)
    assert (replica.pool.name, replica.status) == ("demo-shared", ReplicaStatus.DOWN)
    (gpu,) = replica.gpus.all()
    assert not gpu.replicas.exclude(pk=replica.pk).exists()  # its own GPU
    prices = ModelPrice.objects.filter(served_model=replica.model)
    assert sorted(p.book.name for p in prices) == ["Demo dedicated", "Demo list"]
    assert all((p.input_per_mtok, p.output_per_mtok) == (DEMO_EMBED_PER_MTOK, 0) for p in prices)
    assert replica.model.task != Replica.objects.get(name="vllm-shared").model.task


def test_no_embedding_replica_before_the_demo_fleet():
    assert embed_demo_seed() is None
    assert embed_prices_demo_seed() == 0
