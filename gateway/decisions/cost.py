"""What a decision costs: the endpoint's time at its pool's price, and the gateway's own share.

An instance pool is priced by the hour (`usd_per_hour`), so a decision costs the seconds
it held the endpoint at that rate: what it adds to a busy pool (the hours an idle pool
is paid for are the deployment's, not a decision's: `make cost` counts those). A
Serverless pool is priced per GB-second it serves. The gateway's share is API Gateway's
request, the Lambda's request, and the Lambda's GB-seconds while it waited. Prices:
prices.json beside this module, one file with its source and date (`make cost` reads
the same file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

PRICES = json.loads(Path(__file__).with_name("prices.json").read_text())
LAMBDA_GB = 0.25  # template.yaml's GatewayFunction MemorySize
GATEWAY_OVERHEAD_S = 0.01  # the handler's own time beside the wait, rounded well up from what make bench-gateway measures


@dataclass(frozen=True, slots=True)
class Cost:
    endpoint_seconds: float = 0.0  # every attempt's time on an endpoint, fallbacks included
    endpoint_usd: float = 0.0  # that time at each endpoint's price (0: the pool has none configured)
    gateway_usd: float = 0.0

    @property
    def usd(self) -> float:
        return self.endpoint_usd + self.gateway_usd


def endpoint_usd_per_second(usd_per_hour: float | None, memory_gb: float | None,
                            usd_per_gb_second: float = PRICES["sagemaker_serverless_usd_per_gb_second"],
                            instance_type: str | None = None) -> float:
    """An endpoint's price per second it serves a decision: its instance's hourly price (given,
    or its type's in the price file), or its Serverless memory's GB-seconds; 0 when none is
    known (a type the file lacks is counted at 0, never at a guessed price)."""
    if usd_per_hour is None and instance_type is not None:
        usd_per_hour = PRICES["sagemaker_realtime_usd_per_hour"].get(instance_type)
    if usd_per_hour is not None:
        return usd_per_hour / 3600
    if memory_gb is not None:
        return memory_gb * usd_per_gb_second
    return 0.0


def gateway_usd(seconds: float) -> float:
    """The gateway's share of one request that waited `seconds` on the endpoint."""
    return (PRICES["api_gateway_rest_usd_per_million_requests"] / 1e6 + PRICES["lambda_usd_per_million_requests"] / 1e6
            + LAMBDA_GB * (seconds + GATEWAY_OVERHEAD_S) * PRICES["lambda_usd_per_gb_second"])


@dataclass
class Attempt:
    endpoint: str
    seconds: float  # charged: the attempt's time, or the scorer's own share of it (Meter.busy)
    usd_per_second: float
    by_duration: bool  # billed for its whole duration (Serverless), not a share of an instance
    waited: float = 0.0  # the whole attempt, as the gateway's Lambda waited for it


@dataclass
class Meter:
    """The endpoint time a request has used so far, kept by the pool as each attempt ends (a
    failed attempt held the endpoint too), so a request that fails still settles what it spent;
    and the bytes its record took in the store, settled with it."""

    attempts: list[Attempt] = field(default_factory=list)
    stored_bytes: int = 0
    input_tokens: int = 0  # what the model read for the request, as the endpoint that answered says
    cached_tokens: int = 0  # of those, the tokens it restored from the state it kept
    # What the endpoints' time is charged at, as a share of their price: 1, or the batch price
    # factor for a batch line (bulk work fills time the pool is paid for anyway).
    price_factor: float = 1.0

    def add(self, endpoint: str, seconds: float, usd_per_second: float, by_duration: bool = False) -> None:
        self.attempts.append(Attempt(endpoint, seconds, usd_per_second, by_duration, seconds))

    def busy(self, seconds: float) -> None:
        """The endpoint that answered says it worked `seconds` on the request. On an instance
        that is the request's share (the rest of the attempt it waited in the endpoint's line
        while the instance served others, whose own shares count that time): the sum over
        decisions then matches the instance time they used. A Serverless invocation is
        billed for its whole duration, so its time stays. A figure longer than the attempt
        itself is not believed."""
        last = self.attempts[-1] if self.attempts else None
        if last is not None and not last.by_duration and 0 <= seconds < last.seconds:
            last.seconds = seconds

    def extend(self, seconds: float) -> None:
        """The answering attempt went on `seconds` after the pool had its first piece (a
        stream): the endpoint generated, and the Lambda waited, all that time too."""
        if self.attempts and seconds > 0:
            self.attempts[-1].seconds += seconds
            self.attempts[-1].waited += seconds

    @property
    def seconds(self) -> float:
        return sum(a.seconds for a in self.attempts)

    def cost(self) -> Cost:
        """The endpoints' charged time at their prices; the gateway's share on the whole wait
        (its Lambda is billed for every second it waited, the line included)."""
        return Cost(self.seconds, sum(a.seconds * a.usd_per_second for a in self.attempts) * self.price_factor,
                    gateway_usd(sum(a.waited for a in self.attempts)))


def worst_case(deadline_s: float, usd_per_second: float) -> Cost:
    """The most one request can cost: every second until its deadline on the dearest endpoint
    it may be sent to (attempts run one after another, so their times add up to at most the
    deadline)."""
    return Cost(deadline_s, deadline_s * usd_per_second, gateway_usd(deadline_s))
