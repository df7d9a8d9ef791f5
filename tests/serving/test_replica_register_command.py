"""`manage.py replica_register`: a vLLM server started elsewhere (a
container) joins a pool once its /health answers; a bad GPU serial or a
server that never answers is an error and registers nothing."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from serving.models import Replica
from serving.services import local_gpu_ensure, pool_ensure
from tests.services import free_port


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path in ("/health", "/v1/health/ready") else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm_like():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_server_that_answers_joins_its_pool(db, vllm_like):
    local_gpu_ensure(serial="gpu-7")
    out = StringIO()
    call_command(
        "replica_register", "vllm-0", vllm_like + "/", "--model", "llama", "--pool", "shared-eu",
        "--gpu", "gpu-7", stdout=out,
    )  # fmt: skip
    replica = Replica.objects.get(name="vllm-0")
    assert (replica.base_url, replica.pool.name, replica.model.name) == (
        vllm_like,
        "shared-eu",
        "llama",
    )
    assert [g.serial for g in replica.gpus.all()] == ["gpu-7"] and replica.status == "up"
    assert "replica vllm-0 (vLLM) up in pool shared-eu" in out.getvalue()
    assert replica.engine == "vllm"


def test_another_engine_is_waited_for_at_its_own_readiness_path(db, vllm_like):
    """NIM says it is ready at /v1/health/ready (its /health is a 404 here)."""
    out = StringIO()
    call_command(
        "replica_register", "nim-0", vllm_like, "--model", "llama", "--engine", "nim",
        "--wait", "5", stdout=out,
    )  # fmt: skip
    assert Replica.objects.get(name="nim-0").engine == "nim"
    assert "(NVIDIA NIM)" in out.getvalue()
    with pytest.raises(CommandError, match="/v1/models did not answer"):  # not served here
        call_command(
            "replica_register", "o", vllm_like, "--model", "m", "--engine", "openai", "--wait", "1"
        )


def test_an_unknown_gpu_or_a_silent_server_registers_nothing(db, vllm_like):
    with pytest.raises(CommandError, match="--gpu: no GPU with serial nope"):
        call_command("replica_register", "r", vllm_like, "--model", "m", "--gpu", "nope")
    silent = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CommandError, match="did not answer within 1 s"):
        call_command("replica_register", "r", silent, "--model", "m", "--wait", "1")
    assert not Replica.objects.exists()


def test_a_disaggregated_pool_refuses_a_whole_replica_in_one_line(db, vllm_like):
    pool_ensure(name="split", disaggregated=True)

    with pytest.raises(CommandError) as refused:
        call_command("replica_register", "r", vllm_like, "--model", "m", "--pool", "split")

    assert str(refused.value) == (
        "--pool: pool split is disaggregated: a replica there is a prefill or a decode one"
    )
    assert not Replica.objects.exists()
