"""Attribution arithmetic: worked examples, and conservation on random
timelines (attributed + idle = GPUs x window, exactly, whatever the policy)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.apportion import apportion
from metering.attribution import Timeline, attribute_window
from serving.gpu_shares import GPU_UNITS
from serving.model_config import COMPUTE_PER_TOKEN

S = 1_000_000  # microseconds per second


def timeline(*phases: tuple[int, int, int], prefill=None, context=None) -> Timeline:
    """(start, first token, end) in seconds per request."""
    arr = np.array(phases, dtype=np.int64) * S
    n = len(phases)
    return Timeline(
        start_us=arr[:, 0],
        first_us=arr[:, 1],
        end_us=arr[:, 2],
        prefill_tokens=np.array(prefill or [0.0] * n, dtype=np.float64),
        context_tokens=np.array(context or [0.0] * n, dtype=np.float64),
    )


def seconds(ns) -> list[float]:
    return [x / 1e9 for x in ns]


def test_one_tenant_alone_gets_exactly_the_busy_time():
    result = attribute_window(
        timeline((10, 12, 40)), window_start_us=0, window_end_us=100 * S, gpu_units=2 * GPU_UNITS
    )
    assert seconds(result.device_ns) == [60.0]  # 30 s x 2 GPUs
    assert result.idle_ns == 140 * 10**9
    assert result.capacity_ns == 200 * 10**9


def test_a_mig_instance_and_a_time_sliced_share_hold_their_fraction_of_the_hour():
    # A 3g MIG instance (3 of 7 compute slices), busy the whole hour: all of
    # 3/7 x 3,600 s, to the nanosecond below, is the request's; nothing idle.
    mig = attribute_window(
        timeline((0, 1, 3600)), window_start_us=0, window_end_us=3600 * S, gpu_units=300
    )
    assert mig.capacity_ns == 1_542_857_142_857  # 3/7 x 3,600 s = 1,542.857142857 s
    assert mig.idle_ns == 0
    assert mig.device_ns.tolist() == [1_542_857_142_857]
    # 40% of a time-sliced GPU, busy 0-900 s and 900-1800 s with two
    # requests overlapping 600-900: 0.4 x 3,600 = 1,440 s, half of it idle.
    sliced = attribute_window(
        timeline((0, 1, 900), (600, 601, 1800)),
        window_start_us=0,
        window_end_us=3600 * S,
        gpu_units=40 * GPU_UNITS // 100,
    )
    assert sliced.capacity_ns == 1_440 * 10**9
    assert sliced.idle_ns == 720 * 10**9  # 1,800 s idle x 0.4
    # 0-600 A alone, 600-900 both, 900-1800 B alone; x 0.4.
    assert seconds(sliced.device_ns) == [0.4 * 600 + 0.4 * 150, 0.4 * 150 + 0.4 * 900]


def test_equal_shares_split_overlaps():
    # A alone 0-10, A and B 10-20, B alone 20-30; 30-60 idle.
    result = attribute_window(
        timeline((0, 1, 20), (10, 11, 30)),
        window_start_us=0,
        window_end_us=60 * S,
        gpu_units=1 * GPU_UNITS,
    )
    assert seconds(result.device_ns) == [15.0, 15.0]
    assert result.idle_ns == 30 * 10**9


def test_identical_load_gets_identical_shares_under_roofline():
    result = attribute_window(
        timeline((0, 2, 10), (0, 2, 10), prefill=[100, 100], context=[500, 500]),
        window_start_us=0,
        window_end_us=10 * S,
        gpu_units=1 * GPU_UNITS,
        policy="roofline",
        weight_bytes=1_000_000,
        kv_bytes_per_token=1_000,
    )
    assert seconds(result.device_ns) == [5.0, 5.0]


def test_roofline_charges_a_long_context_more():
    # Decode side by side for 10 s: shares (W/2 + c_i K) / (W + K (c_a + c_b)).
    result = attribute_window(
        timeline((0, 0, 10), (0, 0, 10), context=[1_000, 3_000]),
        window_start_us=0,
        window_end_us=10 * S,
        gpu_units=1 * GPU_UNITS,
        policy="roofline",
        weight_bytes=2_000_000,
        kv_bytes_per_token=1_000,
    )
    w, k = 2e6, 1e3
    f = COMPUTE_PER_TOKEN * w  # each decoding phase's token computed a step
    expected_a = 10 * (w / 2 + 1_000 * k + f) / (w + 4_000 * k + 2 * f)
    assert seconds(result.device_ns) == [round(expected_a, 9), round(10 - expected_a, 9)]


def test_roofline_gives_a_long_prefill_the_step_it_lengthens():
    """bench/device_steps.py on an H200, a Llama-8B shape: a decode step of
    63 sequences at 2,048 tokens of context took about 11 ms, and a prefill
    of 2,048 tokens 65 ms. Beside that batch, the prefill made the step it
    ran in about six times as long: it is owed most of it, where reading
    bytes alone (no compute) gave it under 2%."""
    w, k = 15_316.5 * 2**20, 128 * 1024  # roofline's bytes for the shape
    decoding = [(0, 0, 1)] * 63
    result = attribute_window(
        timeline((0, 1, 1), *decoding, prefill=[2_048] + [0] * 63, context=[0] + [2_048] * 63),
        window_start_us=0,
        window_end_us=1 * S,
        gpu_units=1 * GPU_UNITS,
        policy="roofline",
        weight_bytes=int(w),
        kv_bytes_per_token=int(k),
    )
    prefill_share = result.device_ns[0] / result.capacity_ns
    bytes_alone = (w / 64 + 2_048 * k) / (w + 64 * 2_048 * k)
    assert bytes_alone < 0.02
    # Measured: (65 ms - one weight read of 6.6 ms) of the ~69 ms step.
    assert 0.6 < prefill_share < 0.9
    # Each decoding phase's share is the same, the rest split evenly.
    assert len(set(result.device_ns[1:].tolist())) <= 2


def test_requests_spanning_the_window_are_cut_at_its_edges():
    first_hour = attribute_window(
        timeline((3000, 3001, 4000)),
        window_start_us=0,
        window_end_us=3600 * S,
        gpu_units=1 * GPU_UNITS,
    )
    second_hour = attribute_window(
        timeline((3000, 3001, 4000)),
        window_start_us=3600 * S,
        window_end_us=7200 * S,
        gpu_units=1 * GPU_UNITS,
    )
    assert seconds(first_hour.device_ns) == [600.0]
    assert seconds(second_hour.device_ns) == [400.0]


def test_apportion_keeps_the_total():
    assert sorted(apportion(np.array([1 / 3] * 3), total=1).tolist()) == [0, 0, 1]
    assert apportion(np.array([2.5, 2.5]), total=5).sum() == 5


request = st.tuples(
    st.integers(min_value=-500, max_value=4_000),  # may start before the window
    st.integers(min_value=0, max_value=600),  # prefill length
    st.integers(min_value=0, max_value=3_000),  # decode length
    st.integers(min_value=0, max_value=8_000),  # uncached prompt tokens
    st.integers(min_value=0, max_value=30_000),  # context tokens
)


@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(request, max_size=60),
    # Whole GPUs, MIG instances (sevenths), time-sliced shares (percents)
    # and any mix a replica may hold across GPUs: any number of GPU units.
    gpu_units=st.one_of(
        st.integers(min_value=1, max_value=8).map(lambda n: n * GPU_UNITS),
        st.integers(min_value=1, max_value=7).map(lambda n: n * GPU_UNITS // 7),
        st.integers(min_value=1, max_value=8 * GPU_UNITS),
    ),
    policy=st.sampled_from(["equal", "roofline"]),
    unit_ms=st.integers(min_value=1, max_value=1000),
)
def test_conservation_on_random_timelines(requests, gpu_units, policy, unit_ms):
    unit = unit_ms * 1000  # microseconds per step, so boundaries fall anywhere
    start = np.array([r[0] for r in requests], dtype=np.int64) * unit
    first = start + np.array([r[1] for r in requests], dtype=np.int64) * unit
    end = first + np.array([r[2] for r in requests], dtype=np.int64) * unit
    tl = Timeline(
        start_us=start,
        first_us=first,
        end_us=end,
        prefill_tokens=np.array([r[3] for r in requests], dtype=np.float64),
        context_tokens=np.array([r[4] for r in requests], dtype=np.float64),
    )
    window_end = 3_600 * unit
    result = attribute_window(
        tl,
        window_start_us=0,
        window_end_us=window_end,
        gpu_units=gpu_units,
        policy=policy,
        weight_bytes=5_000_000,
        kv_bytes_per_token=2_048,
    )
    capacity = window_end * 1000 * gpu_units // GPU_UNITS
    assert result.capacity_ns == capacity
    assert result.attributed_ns + result.idle_ns == capacity
    assert (result.device_ns >= 0).all()
    # Nobody is charged beyond the time they were resident in the window.
    resident = np.clip(end, 0, window_end) - np.clip(start, 0, window_end)
    assert (result.device_ns <= resident * 1000 * gpu_units / GPU_UNITS + 1).all()
