"""Who used the GPU: splitting one replica's device time in a window among
the requests resident on it (docs/architecture.md, Attribution). Pure computation on
numpy arrays; metering.windows reads the ledger and stores the results.

A request is resident from being scheduled (sent + vLLM's queue time) to its
last token: a prefill phase up to its first token, then a decode phase. Cut
the window at every phase boundary; in each slice, the slice's device time
(length x GPUs) goes to the phases resident in it by weight:

- equal:    1 / n, n the resident count (processor sharing);
- roofline: (W / n + x_i) / (W + sum_j x_j), W the weight bytes a step
            reads once for the whole batch and x_i what a phase adds to a
            step, in the same bytes:
              decode:  c_i K + F, c_i the average context (prompt +
                       completion / 2), K the KV bytes a token of it holds,
                       F the compute of the one token it makes a step;
              prefill: p_i (K + F), p_i its uncached prompt tokens (each
                       computed and its KV written).
            F = COMPUTE_PER_TOKEN x W (serving/model_config.py): a token's
            2 FLOPs a parameter at the GPU's matrix rate, against its
            weights streamed at its memory bandwidth. Measured on an H200
            (bench/device_steps.py): without F a 2,048-token prefill beside
            a decoding batch was given a few percent of a step it made ten
            times longer.

Both have the form (a / n + x_i) / (a + X), so a phase's total over all
slices is a sum of two prefix sums: O(N log N) for N requests, no loop over
slices. Slices with no resident request are idle.

Times are integer microseconds; results are integer device-nanoseconds,
apportioned (largest remainder) so that attributed + idle equals GPUs x
window length exactly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metering.apportion import apportion
from metering.choices import AttributionPolicy
from serving.gpu_shares import GPU_UNITS
from serving.model_config import COMPUTE_PER_TOKEN

NS_PER_US = 1000


@dataclass(frozen=True)
class Timeline:
    """One replica's requests: epoch microseconds of the phase boundaries
    (start <= first <= end) and the tokens each phase touches."""

    start_us: np.ndarray  # int64, scheduled
    first_us: np.ndarray  # int64, first token (end of prefill)
    end_us: np.ndarray  # int64, last token
    prefill_tokens: np.ndarray  # float64, uncached prompt tokens
    context_tokens: np.ndarray  # float64, average context while decoding

    def __len__(self) -> int:
        return len(self.start_us)

    def subset(self, mask: np.ndarray) -> Timeline:
        return Timeline(
            start_us=self.start_us[mask],
            first_us=self.first_us[mask],
            end_us=self.end_us[mask],
            prefill_tokens=self.prefill_tokens[mask],
            context_tokens=self.context_tokens[mask],
        )


@dataclass(frozen=True)
class WindowAttribution:
    device_ns: np.ndarray  # int64, per request, in request order
    idle_ns: int
    capacity_ns: int

    @property
    def attributed_ns(self) -> int:
        return int(self.device_ns.sum())


def attribute_window(
    timeline: Timeline,
    *,
    window_start_us: int,
    window_end_us: int,
    gpu_units: int,
    policy: str = AttributionPolicy.EQUAL,
    weight_bytes: int | None = None,
    kv_bytes_per_token: int | None = None,
) -> WindowAttribution:
    """`gpu_units`: the replica's share of GPUs, GPU_UNITS to a GPU (a MIG
    instance or a time-sliced share is a fraction of one): the window's
    device time is its length times that, to the nanosecond below."""
    n_req = len(timeline)
    capacity_ns = (window_end_us - window_start_us) * NS_PER_US * gpu_units // GPU_UNITS
    # ok-float: relative weights only; the totals are exact integers (apportion)
    if policy == AttributionPolicy.ROOFLINE and weight_bytes and kv_bytes_per_token is not None:
        a, k = float(weight_bytes), float(kv_bytes_per_token)  # ok-float
        f = COMPUTE_PER_TOKEN * a
        prefill_bytes = timeline.prefill_tokens * (k + f)
        decode_bytes = timeline.context_tokens * k + f
    else:  # equal shares (also roofline without the model's byte counts)
        a = 1.0
        prefill_bytes = decode_bytes = np.zeros(n_req)

    lo, hi = window_start_us, window_end_us
    start = np.clip(timeline.start_us, lo, hi)
    first = np.clip(timeline.first_us, lo, hi)
    end = np.clip(timeline.end_us, lo, hi)
    first = np.maximum(first, start)
    end = np.maximum(end, first)

    # Two phases per request: prefill [start, first), decode [first, end).
    seg_start = np.concatenate([start, first])
    seg_end = np.concatenate([first, end])
    seg_bytes = np.concatenate([prefill_bytes, decode_bytes])
    seg_request = np.concatenate([np.arange(n_req), np.arange(n_req)])

    times = np.unique(np.concatenate([[lo, hi], seg_start, seg_end]))
    slices = len(times) - 1
    i0 = np.searchsorted(times, seg_start)
    i1 = np.searchsorted(times, seg_end)  # i0 == i1 for an empty phase: it counts nowhere

    resident = np.cumsum(
        np.bincount(i0, minlength=slices + 1) - np.bincount(i1, minlength=slices + 1)
    )[:slices]
    added = np.cumsum(
        np.bincount(i0, weights=seg_bytes, minlength=slices + 1)
        - np.bincount(i1, weights=seg_bytes, minlength=slices + 1)
    )[:slices]
    length_us = np.diff(times)
    busy = resident > 0
    idle_ns = int(length_us[~busy].sum()) * NS_PER_US * gpu_units // GPU_UNITS

    device_us = length_us.astype(np.float64) * (gpu_units / GPU_UNITS)
    with np.errstate(divide="ignore", invalid="ignore"):
        denominator = a + np.maximum(added, 0.0)
        per_phase = np.where(busy, device_us * a / (resident * denominator), 0.0)
        per_byte = np.where(busy, device_us / denominator, 0.0)
    cum_phase = np.concatenate([[0.0], np.cumsum(per_phase)])
    cum_byte = np.concatenate([[0.0], np.cumsum(per_byte)])
    seg_value = (cum_phase[i1] - cum_phase[i0]) + seg_bytes * (cum_byte[i1] - cum_byte[i0])
    request_us = np.bincount(seg_request, weights=seg_value, minlength=n_req)

    device_ns = apportion(request_us * NS_PER_US, total=capacity_ns - idle_ns)
    return WindowAttribution(device_ns=device_ns, idle_ns=idle_ns, capacity_ns=capacity_ns)
