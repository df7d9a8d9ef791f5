"""The web app (config.asgi) with each collection of its cyclic garbage
collector written to a file, for bench/ingest's REST API rows:
`BENCH_GC_LOG` names the file's prefix (each worker process appends
"<generation> <ms>" lines to its own file); `BENCH_UNFREEZE=1` undoes the
startup freeze (core.heap), as the web app ran before it had one."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from config.asgi import application  # noqa: F401 (served by uvicorn)
from core.heap import CollectorPauses


class _Logged(CollectorPauses):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self._file = path.open("a", buffering=1)

    def _on_collection(self, phase: str, info: dict) -> None:
        super()._on_collection(phase, info)
        if phase == "stop":
            self._file.write(f"{info['generation']} {self.last * 1000:.3f}\n")


if os.environ.get("BENCH_UNFREEZE") == "1":
    gc.unfreeze()
_Logged(Path(f"{os.environ['BENCH_GC_LOG']}{os.getpid()}")).install()
