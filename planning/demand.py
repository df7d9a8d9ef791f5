"""Every pool's and model's demand forecast from the ledger's hourly
rollups (metering.selectors.totals.demand_frame): tokens and requests an
hour, for the next 30 days from the last whole hour (planning.forecast
says how)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from metering.selectors.totals import demand_frame
from planning.forecast import BACKTEST_HOURS, FIT_WEEKS, HORIZON, WEEK, Forecast, forecast_series
from serving.models import Pool, ServedModel

METRICS = ("tokens", "requests")
# What a forecast reads: the weeks Holt-Winters fits, and the backtest's.
HISTORY_HOURS = FIT_WEEKS * WEEK + BACKTEST_HOURS


@dataclass(frozen=True)
class SeriesForecast:
    pool_id: int
    pool: str
    model: str
    metric: str
    start: datetime  # the first hour forecast
    history: np.ndarray  # the hours read, up to `start`
    forecast: Forecast

    def hours(self) -> list[datetime]:
        return [self.start + timedelta(hours=h) for h in range(len(self.forecast.point))]


def demand_forecasts(
    *,
    now: datetime,
    horizon: int = HORIZON,
    progress: Callable[[int, int], None] | None = None,
) -> list[SeriesForecast]:
    """Each (pool, model) series with demand in the history window, both
    metrics, forecast from the hour `now` falls in (that hour and later are
    not read: not whole yet). `progress(done, total)` after each series."""
    end = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=HISTORY_HOURS)
    frame = demand_frame(start=start, end=end)
    if frame.empty:
        return []
    first = int(start.timestamp())
    frame["slot"] = (frame["hour"] - first) // 3600
    pools = dict(Pool.objects.values_list("pk", "name"))
    models = dict(ServedModel.objects.values_list("pk", "name"))
    groups = list(frame.groupby(["pool_id", "model_id"], sort=True))
    out: list[SeriesForecast] = []
    for done, ((pool_id, model_id), rows) in enumerate(groups, start=1):
        for metric in METRICS:
            series = np.zeros(HISTORY_HOURS)
            series[rows["slot"].to_numpy()] = rows[metric].to_numpy()
            # Hours before the series' first are not zero demand: not there yet.
            series = series[int(rows["slot"].min()) :]
            out.append(
                SeriesForecast(
                    pool_id=int(pool_id),
                    pool=pools.get(int(pool_id), str(pool_id)),
                    model=models.get(int(model_id), str(model_id)),
                    metric=metric,
                    start=end,
                    history=series,
                    forecast=forecast_series(series, horizon),
                )
            )
        if progress is not None:
            progress(done, len(groups))
    return out
