"""Replica metrics: parsed from Prometheus text into samples; a replica that
stops answering goes down and comes back when it answers again."""

from decimal import Decimal

import pytest

from serving.choices import ReplicaStatus
from serving.scraper import metrics_parse, replica_scrape
from serving.services import local_gpu_ensure, pool_ensure, replica_register, served_model_ensure
from tests.gateway.fake_upstream import METRICS_TEXT, FakeUpstream
from tests.services import free_port


def test_metrics_parse_reads_vllm_counters_and_gauges():
    assert metrics_parse(METRICS_TEXT) == {
        "requests_running": 3,
        "requests_waiting": 2,
        "kv_cache_usage": Decimal("0.250000"),
        "prompt_tokens_total": 1234,
        "generation_tokens_total": 567,
        "preemptions_total": 1,
    }


def test_metrics_parse_sums_engines():
    line = 'vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 1234.0\n'
    text = METRICS_TEXT.replace(
        line, line + 'vllm:prompt_tokens_total{engine="1",model_name="tiny-llama"} 6.0\n'
    )
    assert metrics_parse(text)["prompt_tokens_total"] == 1240


def test_each_engine_is_read_by_its_own_counters():
    """NIM 1 exports its own names; NIM 2 (vLLM underneath) vLLM's; TGI's
    tokens are its histograms' sums; SGLang repeats a series per
    tensor-parallel rank (read once)."""
    from serving.engines import engine_spec

    def parse(engine: str, text: str) -> dict:
        return metrics_parse(text, engine_spec(engine).counters)

    nim1 = '# TYPE prompt_tokens_total counter\nprompt_tokens_total{model_name="m"} 70.0\n'
    assert parse("nim", nim1) == {"prompt_tokens_total": 70}
    assert parse("nim", METRICS_TEXT)["prompt_tokens_total"] == 1234  # vLLM's names
    tgi = (
        "# TYPE tgi_request_input_length histogram\n"
        'tgi_request_input_length_bucket{le="+Inf"} 3\n'
        "tgi_request_input_length_sum 21\ntgi_request_input_length_count 3\n"
    )
    assert parse("tgi", tgi) == {"prompt_tokens_total": 21}
    sglang = "".join(f'sglang:prompt_tokens_total{{tp_rank="{rank}"}} 9.0\n' for rank in ("0", "1"))
    assert parse("sglang", "# TYPE sglang:prompt_tokens_total counter\n" + sglang) == {
        "prompt_tokens_total": 9
    }


@pytest.mark.django_db
def test_silent_replica_goes_down_and_comes_back():
    fake = FakeUpstream().start()
    try:
        replica = replica_register(
            name="r",
            base_url=fake.base_url,
            model=served_model_ensure(name="m"),
            pool=pool_ensure(name="shared"),
            gpus=[local_gpu_ensure(serial="g")],
        )
        sample = replica_scrape(replica=replica)
        assert sample.up and sample.generation_tokens_total == 567
        replica.base_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        sample = replica_scrape(replica=replica)
        replica.refresh_from_db()
        assert not sample.up and sample.error
        assert replica.status == ReplicaStatus.DOWN
        assert "ConnectError" in replica.last_error
        replica.base_url = fake.base_url
        replica_scrape(replica=replica)
        replica.refresh_from_db()
        assert replica.status == ReplicaStatus.UP and replica.last_seen_at is not None
    finally:
        fake.stop()
