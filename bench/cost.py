"""What a decision costs on each kind of pool, for a traffic shape: `make cost`.

    python -m bench.cost [--figures seeds|measured] [--per-hour N | --hourly a,b,...] [...]

For each pool kind (a CPU instance, a GPU instance, SageMaker Serverless) it prints the
price per 1,000 decisions and per month, and the break-even traffic between them, from
one service time per decision (seconds an instance is busy with it):

- `seeds`: the figures published with the llama.cpp SageMaker walkthrough (Qwen3.5-4B
  Q4_K_M, serial: p50 1.715 s, p95 19.3 s on ml.c6i.8xlarge; p50 0.352 s on
  ml.g6e.xlarge). Only their p50 is published for both, so the p50 drives the price,
  which is optimistic: a mean sits above a median when the tail is long (the CPU's p95
  is 11x its p50);
- `measured`: this machine's own run of `make bench-load` (reports/bench_load.json,
  one request at a time: the mean when the report has it, else the p50), standing for
  the smallest CPU instance in the price file;
- or any `--cpu-s` / `--gpu-s` / `--serverless-s` given.

A real-time pool pays for its instances by the hour whether busy or not: each hour gets
the instances its traffic needs at `--utilisation` (an autoscaling target), never fewer
than `--min-instances`, each serving `--concurrency` decisions at once. Serverless pays
only GB-seconds of the time it serves (`--serverless-gb` of memory), scales to zero,
and refuses a call over 60 s; it runs on CPU with fewer cores than a large instance
(`--serverless-vcpus`, an assumption: AWS does not publish them); its cold starts are unbilled but slow (a pool to route a
quiet tenant to, not a fallback). The gateway's own share (API Gateway requests, the
Lambda's requests and GB-seconds while it waits on the endpoint) is added to every pool.
The asynchronous pool (DeployAsyncEndpoint: batch lines only, their answers within the batch's
window) runs the GPU instance only while a backlog waits: each hour with traffic pays its busy
time, a burst's first hour a cold start (`--async-cold-start-min`: an instance, the image and the
model loading; an assumption, as the pool is untested in AWS) and its last the idle minutes
before the pool scales back to zero (`--async-idle-min`: the 600 s scale-in cooldown and the
backlog alarm's minutes). It answers no interactive request, so it is never in the break-even.
Prices: gateway/decisions/prices.json (one file, with its source and date, which
the gateway prices each decision with too). Writes reports/cost.json
and reports/cost.png (price per 1,000 decisions against steady traffic).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from gateway.decisions.cost import PRICES, gateway_usd

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
DAYS_PER_MONTH = 30
SERVERLESS_MAX_S = 60.0


@dataclass(frozen=True)
class Pool:
    name: str
    kind: str  # "realtime", "serverless" or "async"
    seconds: float  # service time per decision: what an instance is busy with one
    figure: str  # which measurement `seconds` is (p50, mean, given)
    instance: str | None = None
    concurrency: int = 1
    memory_gb: float = 0.0


@dataclass(frozen=True)
class Month:
    pool: str
    decisions: float
    endpoint_usd: float
    gateway_usd: float
    instance_hours: float
    utilisation: float  # busy share of the instance-hours paid for (1.0 for Serverless)
    served: bool = True  # False: a decision takes longer than the pool allows

    @property
    def usd(self) -> float:
        return self.endpoint_usd + self.gateway_usd

    @property
    def per_1000(self) -> float:
        return 1000 * self.usd / self.decisions if self.decisions else math.inf


def busy_per_1000(pool: Pool) -> float:
    """The endpoint's price of 1,000 decisions on a fully busy pool (the walkthrough's arithmetic)."""
    if pool.kind == "serverless":
        return 1000 * pool.seconds * pool.memory_gb * PRICES["sagemaker_serverless_usd_per_gb_second"]
    return 1000 * pool.seconds / pool.concurrency * PRICES["sagemaker_realtime_usd_per_hour"][pool.instance] / 3600


ASYNC_COLD_START_MIN = 8.0
ASYNC_IDLE_MIN = 20.0


def month(pool: Pool, hourly: list[float], utilisation: float, min_instances: int,
          cold_start_min: float = ASYNC_COLD_START_MIN, idle_min: float = ASYNC_IDLE_MIN) -> Month:
    """A month of `hourly` traffic (decisions in each hour of the day) on `pool`."""
    daily = sum(hourly)
    if pool.kind == "async":
        return async_month(pool, hourly, cold_start_min, idle_min)
    gateway = DAYS_PER_MONTH * daily * gateway_usd(pool.seconds)
    if pool.kind == "serverless":
        endpoint = DAYS_PER_MONTH * daily * busy_per_1000(pool) / 1000
        return Month(pool.name, DAYS_PER_MONTH * daily, endpoint, gateway, 0.0, 1.0, pool.seconds <= SERVERLESS_MAX_S)
    capacity = 3600 * pool.concurrency * utilisation / pool.seconds  # decisions an instance takes in an hour
    instances = [max(min_instances, math.ceil(rate / capacity)) for rate in hourly]
    hours = DAYS_PER_MONTH * sum(instances)
    busy = DAYS_PER_MONTH * daily * pool.seconds / pool.concurrency / 3600
    price = PRICES["sagemaker_realtime_usd_per_hour"][pool.instance]
    return Month(pool.name, DAYS_PER_MONTH * daily, hours * price, gateway, hours, busy / hours if hours else 0.0)


def async_month(pool: Pool, hourly: list[float], cold_start_min: float, idle_min: float) -> Month:
    """A month on the asynchronous pool: instance time only while work waits (its busy time at
    full use, lines one after another), a cold start where a burst begins and the idle minutes
    where it ends (the day wraps around); no gateway request per line (the worker reads each
    answer back in milliseconds: its Lambda time is counted, at no wait)."""
    hours = 0.0
    for hour, rate in enumerate(hourly):
        if rate <= 0:
            continue
        hours += rate * pool.seconds / pool.concurrency / 3600
        hours += cold_start_min / 60 if hourly[hour - 1] <= 0 else 0.0
        hours += idle_min / 60 if hourly[(hour + 1) % 24] <= 0 else 0.0
    daily = sum(hourly)
    busy = daily * pool.seconds / pool.concurrency / 3600
    price = PRICES["sagemaker_realtime_usd_per_hour"][pool.instance]
    gateway = DAYS_PER_MONTH * daily * (gateway_usd(0.0) - PRICES["api_gateway_rest_usd_per_million_requests"] / 1e6)
    return Month(pool.name, DAYS_PER_MONTH * daily, DAYS_PER_MONTH * hours * price, gateway, DAYS_PER_MONTH * hours,
                 busy / hours if hours else 0.0)


def break_even(pools: list[Pool], utilisation: float, min_instances: int) -> list[tuple[float, str]]:
    """Steady traffic (decisions an hour) at which the cheapest pool for interactive requests
    changes, and the pool from there on (the asynchronous pool answers batches only)."""
    pools = [p for p in pools if p.kind != "async"]
    changes: list[tuple[float, str]] = []
    for step in range(0, 601):
        rate = 10 ** (step / 100)  # 1 to 1,000,000 an hour
        months = [month(p, [rate] * 24, utilisation, min_instances) for p in pools]
        cheapest = min((m for m in months if m.served), key=lambda m: m.usd).pool
        if not changes or changes[-1][1] != cheapest:
            changes.append((rate, cheapest))
    return changes


def seeds_pools(serverless_gb: float, serverless_vcpus: float) -> list[Pool]:
    cpu = Pool("CPU ml.c6i.8xlarge", "realtime", 1.715, "p50 (seeds; p95 19.3 s)", "ml.c6i.8xlarge")
    gpu = Pool("GPU ml.g6e.xlarge", "realtime", 0.352, "p50 (seeds)", "ml.g6e.xlarge")
    # Serverless runs on CPU with fewer cores than the 32-vCPU instance: its time scaled by the
    # cores (llama.cpp's prefill scales about so), an assumption --serverless-s replaces.
    scale = PRICES["instance_vcpus"]["ml.c6i.8xlarge"] / serverless_vcpus
    serverless = Pool(f"Serverless {serverless_gb:g} GB", "serverless", 1.715 * scale,
                      f"seeds' CPU p50 x {scale:g} (vCPUs)", memory_gb=serverless_gb)
    return [cpu, gpu, serverless]


def measured_pools(serverless_gb: float) -> list[Pool]:
    report = REPORTS / "bench_load.json"
    if not report.exists():
        raise SystemExit("no reports/bench_load.json: run `make bench-load` first, or pass --figures seeds")
    serial = next(r for r in json.loads(report.read_text())["pool"]
                  if r.get("concurrency") == 1 and r.get("phase", "steady") == "steady")
    figure, seconds = ("mean", serial["mean_s"]) if "mean_s" in serial else ("p50", serial["p50_s"])
    label = f"{figure} of make bench-load, serial, on this machine (2 shared cores)"
    return [Pool("CPU ml.c7i.xlarge", "realtime", seconds, label, "ml.c7i.xlarge"),
            Pool(f"Serverless {serverless_gb:g} GB", "serverless", seconds, label, memory_gb=serverless_gb)]


def async_pool(pools: list[Pool], instance: str | None) -> Pool:
    """The asynchronous pool on the GPU figures' instance (the CPU's where only it was measured),
    or on `instance` at the same seconds a decision (its own speed is not measured)."""
    base = next((p for p in pools if p.name.startswith("GPU")), pools[0])
    chosen = instance or base.instance
    if chosen not in PRICES["sagemaker_realtime_usd_per_hour"]:
        raise SystemExit(f"--async-instance {chosen}: not in gateway/decisions/prices.json")
    figure = base.figure if chosen == base.instance else f"{base.figure} on {base.instance}"
    return Pool(f"Async {chosen}", "async", base.seconds, figure, chosen)


def hourly_traffic(args: argparse.Namespace) -> list[float]:
    if args.hourly:
        values = [float(v) for v in args.hourly.split(",")]
        if len(values) != 24 or any(v < 0 for v in values):
            raise SystemExit("--hourly takes 24 decision counts, one per hour of the day, none negative")
        return values
    return [float(args.per_hour)] * 24


def main() -> int:
    args = parse_args()
    pools = (seeds_pools(args.serverless_gb, args.serverless_vcpus) if args.figures == "seeds"
             else measured_pools(args.serverless_gb))
    given = {"CPU": args.cpu_s, "GPU": args.gpu_s, "Serverless": args.serverless_s}
    pools = [Pool(p.name, p.kind, given[p.name.split()[0]], "given", p.instance, args.concurrency, p.memory_gb)
             if given[p.name.split()[0]] else
             Pool(p.name, p.kind, p.seconds, p.figure, p.instance, args.concurrency, p.memory_gb) for p in pools]
    pools.append(async_pool(pools, args.async_instance))
    hourly = hourly_traffic(args)
    months = [month(p, hourly, args.utilisation, args.min_instances, args.async_cold_start_min, args.async_idle_min)
              for p in pools]
    changes = break_even(pools, args.utilisation, args.min_instances)
    print_report(pools, months, changes, hourly, args)
    REPORTS.mkdir(exist_ok=True)
    report = {"prices": {"source": PRICES["source"], "collected": PRICES["collected"]}, "hourly": hourly,
              "pools": [{**asdict(p), "busy_per_1000_usd": busy_per_1000(p)} for p in pools],
              "months": [{**asdict(m), "usd": m.usd, "per_1000_usd": m.per_1000} for m in months],
              "break_even": [{"from_per_hour": rate, "cheapest": name} for rate, name in changes],
              "utilisation_target": args.utilisation, "min_instances": args.min_instances,
              "async": {"cold_start_min": args.async_cold_start_min, "idle_min": args.async_idle_min,
                        "untested": "the asynchronous pool has not run in AWS: its cold start is an assumption"}}
    (REPORTS / "cost.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(pools, args, REPORTS / "cost.png")
    print(f"\nwrote {REPORTS / 'cost.json'} and {REPORTS / 'cost.png'}")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures", choices=["seeds", "measured"], default="seeds")
    traffic = parser.add_mutually_exclusive_group()
    traffic.add_argument("--per-hour", type=float, default=1000.0, help="steady decisions an hour (default 1000)")
    traffic.add_argument("--hourly", help="24 comma-separated decision counts, one per hour of the day")
    parser.add_argument("--utilisation", type=float, default=0.7, help="the autoscaling target (busy share)")
    parser.add_argument("--min-instances", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1, help="decisions an instance serves at once")
    parser.add_argument("--serverless-gb", type=float, default=6.0, help="Serverless memory (1 to 6 GB)")
    parser.add_argument("--cpu-s", type=float, help="seconds per decision on the CPU instance (instead of the figures)")
    parser.add_argument("--gpu-s", type=float, help="seconds per decision on the GPU instance")
    parser.add_argument("--serverless-s", type=float, help="seconds per decision on Serverless")
    parser.add_argument("--serverless-vcpus", type=float, default=4.0,
                        help="cores Serverless gives --serverless-gb (AWS does not publish it: an assumption)")
    parser.add_argument("--async-instance", help="the asynchronous pool's instance (default: the GPU figures' own)")
    parser.add_argument("--async-cold-start-min", type=float, default=ASYNC_COLD_START_MIN,
                        help="minutes an asynchronous pool pays to come back from zero (an assumption: untested in AWS)")
    parser.add_argument("--async-idle-min", type=float, default=ASYNC_IDLE_MIN,
                        help="minutes it idles after a burst before it scales back to zero")
    args = parser.parse_args()
    if args.async_cold_start_min < 0 or args.async_idle_min < 0:
        parser.error("--async-cold-start-min and --async-idle-min are minutes, at least 0")
    if not 0 < args.utilisation <= 1 or args.min_instances < 0 or args.concurrency < 1:
        parser.error("--utilisation is in (0, 1], --min-instances at least 0, --concurrency at least 1")
    if not 1 <= args.serverless_gb <= 6:
        parser.error("--serverless-gb is 1 to 6 (Serverless Inference's memory sizes)")
    return args


def print_report(pools: list[Pool], months: list[Month], changes: list[tuple[float, str]], hourly: list[float],
                 args: argparse.Namespace) -> None:
    print(f"prices: {PRICES['region']}, {PRICES['collected']} (gateway/decisions/prices.json); traffic {sum(hourly):,.0f}"
          f" decisions a day; autoscaling target {args.utilisation:.0%}, at least {args.min_instances} instance(s)")
    print(f"\n{'pool':<22} {'s/decision':>10}  {'figure':<34} {'busy $/1k':>9} {'$/1k':>8} {'$/month':>10}"
          f" {'inst-h':>7} {'util':>5}")
    for pool, m in zip(pools, months, strict=True):
        cost = f"{m.per_1000:>8.3f} {m.usd:>10,.2f}" if m.served else f"{'refused: over 60 s':>19}"
        print(f"{pool.name:<22} {pool.seconds:>10.3f}  {pool.figure[:34]:<34} {busy_per_1000(pool):>9.3f} {cost}"
              f" {m.instance_hours:>7.0f} {m.utilisation:>5.0%}")
    print(f"\nAsync: batch lines only (answered within the batch's window); a burst pays a cold start of"
          f" {args.async_cold_start_min:g} min (assumed: the pool is untested in AWS) and {args.async_idle_min:g} min idle"
          " before it scales back to zero")
    print("\ncheapest for interactive requests at steady traffic:")
    for (rate, name), following in zip(changes, [*changes[1:], None], strict=True):
        upto = f"up to {following[0]:,.0f}" if following else "and above"
        print(f"  from {rate:,.0f} decisions an hour {upto}: {name}")


def plot(pools: list[Pool], args: argparse.Namespace, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [10 ** (step / 20) for step in range(0, 101)]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for pool in pools:
        months = [month(pool, [r] * 24, args.utilisation, args.min_instances, args.async_cold_start_min,
                        args.async_idle_min) for r in rates]
        ax.plot(rates, [m.per_1000 if m.served else math.nan for m in months], label=pool.name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("steady decisions per hour")
    ax.set_ylabel("USD per 1,000 decisions (endpoint + gateway)")
    ax.set_title(f"Cost per 1,000 decisions ({args.figures} figures, target {args.utilisation:.0%},"
                 f" min {args.min_instances} instance)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
