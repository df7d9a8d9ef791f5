"""Hourly demand forecasts, one series at a time: pure numpy (and
statsmodels), no database.

Two methods compete on every series, and a backtest picks one:

- seasonal naive: each hour of the coming weeks is the same hour of the
  last week (the week holds both the daily and the weekly pattern);
- exponential smoothing (Holt-Winters, statsmodels): level, a damped
  additive trend and an additive 168-hour season, fitted on the last
  FIT_WEEKS weeks (older weeks say little about next month's level, and
  fitting a year of hours costs 6x the time for no better error, measured
  on a generated year with a trend).

The backtest holds out the last BACKTEST_HOURS, forecasts them from what
came before with each method, and scores both by MASE: the mean absolute
error over the in-sample mean absolute change from one week to the next
(a scaled error: unlike MAPE it holds where demand is near zero). The
lower wins, and is refitted on everything for the forecast (Holt-Winters
with the smoothing the backtest found).

Prediction intervals are empirical (split conformal): the winner's
backtest errors' quantiles, widened with the square root of how far past
the backtest's own reach an hour lies; demand never goes below zero. A
series shorter than MIN_HOURS is too thin to backtest: its forecast says
so (method "too_thin") and is seasonal naive where a week is known."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

WEEK = 168
FIT_WEEKS = 8
BACKTEST_HOURS = 2 * WEEK
MIN_HOURS = 2 * WEEK + BACKTEST_HOURS  # two seasons to fit, two weeks to test
HORIZON = 30 * 24
BANDS = {"80": (0.10, 0.90), "95": (0.025, 0.975)}


@dataclass(frozen=True)
class Forecast:
    """A series' next `len(point)` hours, the method that made them, its
    backtest and the bands (lower, upper) per coverage ("80", "95")."""

    method: str  # "ets" | "seasonal_naive" | "too_thin"
    point: np.ndarray
    bands: dict[str, tuple[np.ndarray, np.ndarray]]
    mase: dict[str, float]  # per method backtested; empty when too thin

    @property
    def error(self) -> float | None:
        """The chosen method's backtest MASE."""
        return self.mase.get(self.method)


def seasonal_naive(history: np.ndarray, horizon: int, season: int = WEEK) -> np.ndarray:
    last = history[-season:]
    return np.resize(last, horizon).astype(float)


def _holt_winters(history: np.ndarray, params: dict | None = None):
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    model = ExponentialSmoothing(
        history[-FIT_WEEKS * WEEK :].astype(float),
        trend="add",
        damped_trend=True,
        seasonal="add",
        seasonal_periods=WEEK,
        initialization_method="heuristic",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on flat series
        if params is None:
            return model.fit()
        return model.fit(**params, optimized=False)


def ets(history: np.ndarray, horizon: int, params: dict | None = None) -> tuple[np.ndarray, dict]:
    """Holt-Winters' forecast and the smoothing it used (found, or given)."""
    fitted = _holt_winters(history, params)
    found = {
        name: float(fitted.params[name])
        for name in ("smoothing_level", "smoothing_trend", "smoothing_seasonal", "damping_trend")
    }
    return np.asarray(fitted.forecast(horizon), dtype=float), found


def mase(
    actual: np.ndarray, predicted: np.ndarray, insample: np.ndarray, season: int = WEEK
) -> float:
    """Mean absolute error scaled by the in-sample seasonal naive's (a week
    to the next); 0 for a perfect forecast of a series that never changes,
    inf where a flat history meets any error."""
    error = float(np.mean(np.abs(actual - predicted)))
    scale = float(np.mean(np.abs(insample[season:] - insample[:-season])))
    if scale == 0:
        return 0.0 if error == 0 else float("inf")
    return error / scale


def forecast_series(history: np.ndarray, horizon: int = HORIZON) -> Forecast:
    """The series' next `horizon` hours (the module's docstring)."""
    history = np.asarray(history, dtype=float)
    if len(history) < MIN_HOURS:
        point = seasonal_naive(history, horizon) if len(history) >= WEEK else np.zeros(horizon)
        return Forecast("too_thin", point, {k: (point, point) for k in BANDS}, {})
    train, test = history[:-BACKTEST_HOURS], history[-BACKTEST_HOURS:]
    tried = {"seasonal_naive": seasonal_naive(train, BACKTEST_HOURS)}
    if np.ptp(history[-FIT_WEEKS * WEEK :]) == 0:  # flat: nothing to smooth, nothing to miss
        point = seasonal_naive(history, horizon)
        return Forecast(
            "seasonal_naive", point, {k: (point, point) for k in BANDS}, {"seasonal_naive": 0.0}
        )
    tried["ets"], params = ets(train, BACKTEST_HOURS)
    scores = {name: mase(test, guess, train) for name, guess in tried.items()}
    method = min(scores, key=lambda name: (scores[name], name != "seasonal_naive"))
    residuals = test - tried[method]
    if method == "ets":
        point, _ = ets(history, horizon, params)
    else:
        point = seasonal_naive(history, horizon)
    widen = np.sqrt(np.maximum(1.0, np.arange(1, horizon + 1) / BACKTEST_HOURS))
    bands = {}
    for name, (low, high) in BANDS.items():
        below, above = np.quantile(residuals, [low, high])
        bands[name] = (
            np.maximum(point + below * widen, 0.0),
            np.maximum(point + above * widen, 0.0),
        )
    return Forecast(method, np.maximum(point, 0.0), bands, scores)
