"""The cost calculator's arithmetic (bench/cost.py), against the figures it starts from."""

from __future__ import annotations

import pytest

from bench.cost import PRICES, Pool, async_pool, break_even, busy_per_1000, month, seeds_pools


def test_it_reproduces_the_walkthroughs_arithmetic_within_a_cent():
    # Given the published p50s (CPU 1.715 s on ml.c6i.8xlarge, GPU 0.352 s on ml.g6e.xlarge),
    # a fully busy pool costs what the walkthrough says per 1,000 decisions: $0.78 and $0.25.
    cpu, gpu, _ = seeds_pools(6.0, 4.0)
    assert busy_per_1000(cpu) == pytest.approx(0.78, abs=0.01)
    assert busy_per_1000(gpu) == pytest.approx(0.25, abs=0.01)


def test_an_idle_instance_is_paid_for_and_serverless_is_not():
    # Given one decision an hour, the CPU pool still pays its one instance all month, and
    # Serverless pays only the seconds it served.
    cpu, _, serverless = seeds_pools(6.0, 4.0)
    quiet = [1.0] * 24
    assert month(cpu, quiet, 0.7, 1).endpoint_usd == pytest.approx(30 * 24 * 1.632)
    expected = 30 * 24 * serverless.seconds * 6.0 * PRICES["sagemaker_serverless_usd_per_gb_second"]
    assert month(serverless, quiet, 0.7, 1).endpoint_usd == pytest.approx(expected)


def test_busy_hours_get_the_instances_their_traffic_needs():
    # At a 70% target one 1.715 s instance takes 1,469 decisions an hour: 3,000 need three.
    cpu, _, _ = seeds_pools(6.0, 4.0)
    hourly = [0.0] * 12 + [3000.0] * 12
    assert month(cpu, hourly, 0.7, 1).instance_hours == 30 * (12 * 1 + 12 * 3)
    assert month(cpu, hourly, 0.7, 0).instance_hours == 30 * 12 * 3  # scaled to zero at night


def test_serverless_refuses_work_over_its_60_s_and_is_never_chosen_for_it():
    slow = Pool("Serverless 6 GB", "serverless", 75.0, "given", memory_gb=6.0)
    cpu, _, _ = seeds_pools(6.0, 4.0)
    assert not month(slow, [10.0] * 24, 0.7, 1).served
    assert all(name != slow.name for _, name in break_even([cpu, slow], 0.7, 1))


def test_the_cheapest_pool_goes_from_serverless_to_the_gpu_as_traffic_grows():
    changes = break_even(seeds_pools(6.0, 4.0), 0.7, 1)
    assert changes[0][1].startswith("Serverless") and changes[-1][1].startswith("GPU")
    assert [rate for rate, _ in changes] == sorted(rate for rate, _ in changes)


def test_the_asynchronous_pool_pays_busy_time_a_cold_start_and_idle_minutes_only_where_work_waits():
    # Given an hour of 1,000 decisions at night and nothing else, it pays those decisions' GPU
    # time, one cold start and the idle minutes before it scales to zero: no instance all day.
    pools = seeds_pools(6.0, 4.0)
    pool = async_pool(pools, None)
    assert pool.instance == "ml.g6e.xlarge" and pool.seconds == 0.352
    night = [1000.0] + [0.0] * 23
    hours = 1000 * 0.352 / 3600 + 8 / 60 + 20 / 60
    assert month(pool, night, 0.7, 1).instance_hours == pytest.approx(30 * hours)
    assert month(pool, night, 0.7, 1, cold_start_min=0, idle_min=0).endpoint_usd == pytest.approx(
        30 * 1000 * 0.352 / 3600 * 2.605)
    steady = month(pool, [1000.0] * 24, 0.7, 1)  # busy all day: no burst begins or ends
    assert steady.instance_hours == pytest.approx(30 * 24 * 1000 * 0.352 / 3600) and steady.utilisation == 1.0
    assert all(not name.startswith("Async") for _, name in break_even([*pools, pool], 0.7, 1))
    assert async_pool(pools, "ml.g5.xlarge").name == "Async ml.g5.xlarge"
