"""The benches' harness refuses to publish a broken run: an arm whose
requests failed fails the bench, naming the arm and its first error, and
docs/benchmarks.md is left as it was (issue 62: every budget arm of
`./dev bench gateway` answered 409 model_not_priced, and the bench wrote
x 0.000 ratios and exited 0)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

import bench.common
from bench.common import BenchFailed, LoadResult, load, report_write


def test_an_arm_with_errors_fails_the_bench_naming_it_and_writes_nothing(tmp_path, monkeypatch):
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\nas it was\n")
    monkeypatch.setattr(bench.common, "REPORT", report)

    async def scenario():
        async def priced(request):
            if request.headers.get("Authorization") == "Bearer unpriced":
                return web.json_response({"error": {"code": "model_not_priced"}}, status=409)
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", priced)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            common = {"body": b"{}", "requests": 20, "concurrency": 4, "stream": False}
            good = await load("plain", url, headers={}, **common)
            bad = await load("budget", url, headers={"Authorization": "Bearer unpriced"}, **common)
        finally:
            await runner.cleanup()
        return good, bad

    good, bad = asyncio.run(scenario())
    assert (good.errors, bad.errors) == (0, 20)
    assert bad.first_error.startswith("409 ") and "model_not_priced" in bad.first_error
    assert LoadResult.merged([good, bad]).first_error == bad.first_error
    section = {"name": "x", "title": "X", "command": "./dev bench x", "body": "| x |"}
    with pytest.raises(BenchFailed) as failed:
        report_write(**section, results=[good, bad])
    assert "budget: 20 of 20 failed; first: 409" in str(failed.value)
    assert "plain" not in str(failed.value)
    assert report.read_text() == "# Benchmarks\n\nas it was\n"
    report_write(**section, results=[good])
    assert "<!-- bench:x -->" in report.read_text()
