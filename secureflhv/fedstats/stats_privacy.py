"""Record-level differential privacy of federated preprocessing: distributed Skellam noise on both rounds' sums.

Each client adds integer Skellam noise (:mod:`secureflhv.dp.integer_sums`) to its round-A and round-B vectors
(:mod:`secureflhv.fedstats.statistics`) before secure aggregation, so the pooled statistics every party gets are
noised and nobody sees an un-noised sum. The unit is one record: a row of one client's training table added or
removed. Sensitivities, in the summed integers' units:

* round A (counts; the range sketch is not sent: DP needs public ``ranges``). A row adds 1 to the row count and,
  per column, exactly one 1: to the present or the missing count of a numeric column, to its category's count or
  the missing count of a categorical one. Its vector has 1 + (columns) ones: Δ2 = sqrt(1 + columns),
  Δ1 = 1 + columns.
* round B (moments; ``b`` bits, m numeric columns). A row adds q_j to sum q and q_j^2 to sum q^2 of each numeric
  column j it has a value in, |q_j| <= 2^b: two releases with their own noise, sum q (Δ2 = 2^b sqrt(m),
  Δ1 = m 2^b) and sum q^2 (Δ2 = 4^b sqrt(m), Δ1 = m 4^b). The clipped counts are sent as 0 (not released).

Why the range sketch is refused: the log-magnitude histogram's outermost non-empty buckets ARE the extreme values
(to 9%), and a min or max has unbounded sensitivity to one row; noise on the bucket counts would leave a bucket
holding one row detectable at any useful ε, and a noised count cannot give a range holding every value. DP ranges
would need another mechanism (e.g. a DP quantile); declare public ranges instead.

Plan: one noise multiplier z for the job (:class:`~secureflhv.dp.integer_sums.SumNoisePlan`); release r's sum
carries variance (z Δ2_r)^2 at least. With ``target_epsilon`` z is calibrated over the job's releases with round
B's sensitivities at b = :data:`MIN_BITS` (the fewest bits it can have): at a fixed z the Skellam RDP bound
decreases as the sensitivity grows (its discreteness term is O(1 / (z^2 Δ2))), so the b actually used (chosen
after round A, from the noised row count: adaptive composition) spends at most the planned ε; the record gives
the ε at the sensitivities used. b under DP: :func:`moment_bits` of the noised row count plus the noise's reach,
capped so a client's Poisson means stay below 2^40.

Dropouts and colluders (as :mod:`secureflhv.horizontal.dp_distributed`): a client that submits to a round with n
participants (its own list: all the job's clients in round A, the server's list in round B) uses the threshold
t = ``resolve_threshold(n)`` its secure-aggregation shares enforce; it adds mu_r / (t - c) with c =
``max_colluders``, and each release is accounted at (survivors - c) mu_r / (t - c) >= mu_r.

What each role learns: the server and every client learn the noised pooled sums (and who took part), which are
(ε, δ)-DP for any one row; never a client's vector. A client that skips its noise weakens the guarantee by its
share only when more than c clients misbehave. The noise comes from OS entropy (``noise_seed`` only for tests).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ..dp.calibration import MAX_POISSON_MEAN
from ..dp.integer_sums import SumAccountant, SumNoisePlan, SumRelease
from ..dp.mechanisms import noise_rng
from ..secagg import AggregationConfig
from .statistics import StatsError, StatsSpec, moment_bits

MIN_BITS = 4            # the fewest moment bits (moment_bits refuses fewer); round B is planned at it
_SIGMAS = 10.0          # headroom of the noise in the row-count check and the moment bits (~e^-50 to pass it)
_RANGES_NEEDED = ("differential privacy needs public ranges (params.preprocessing.ranges): the log-magnitude "
                  "range sketch reveals each column's extreme values, which one row decides and noise cannot "
                  "hide (a DP range would need another mechanism, e.g. DP quantiles)")


def release_a(spec: StatsSpec) -> SumRelease:
    """Round A's release: one row adds a 0/1 vector with 1 + len(names) ones (module docstring)."""
    k = 1 + len(spec.names)
    return SumRelease("counts", spec.dim_a, math.sqrt(k), float(k))


def releases_b(spec: StatsSpec, bits: int) -> tuple[SumRelease, SumRelease]:
    """Round B's releases at ``bits`` = b: sum q (|q| <= 2^b) and sum q^2 (<= 4^b) over the m numeric columns."""
    m = len(spec.numeric)
    return (SumRelease("sum_q", m, 2.0 ** bits * math.sqrt(m), m * 2.0 ** bits),
            SumRelease("sum_q2", m, 4.0 ** bits * math.sqrt(m), m * 4.0 ** bits))


def planned_releases(spec: StatsSpec) -> tuple[SumRelease, ...]:
    """What a job releases: round A, and round B's two at :data:`MIN_BITS` when ``spec.moments``."""
    return (release_a(spec),) + (releases_b(spec, MIN_BITS) if spec.moments and spec.numeric else ())


@dataclass(frozen=True)
class StatsDP:
    """The noise of one federated preprocessing run, identical at the server and every client.

    Attributes:
        plan: the job's multiplier and δ (:meth:`of`).
        aggregation: the job's aggregation settings (each round's threshold t, ``max_colluders`` c).
        noise_seed: tests only; None draws the noise from OS entropy.
    """

    plan: SumNoisePlan
    aggregation: AggregationConfig
    noise_seed: int | None = None

    @classmethod
    def of(cls, spec: StatsSpec, aggregation: AggregationConfig, *, delta: float,
           noise_multiplier: float | None = None, target_epsilon: float | None = None,
           noise_seed: int | None = None) -> "StatsDP":
        """Plan the noise for ``spec``'s releases. Raises StatsError without public ranges, ValueError for a
        calibration that fails (:meth:`SumNoisePlan.calibrate`)."""
        if spec.ranges is None:
            raise StatsError(_RANGES_NEEDED)
        plan = SumNoisePlan.calibrate(planned_releases(spec), delta, epsilon=target_epsilon,
                                      noise_multiplier=noise_multiplier)
        return cls(plan, aggregation, noise_seed)

    def honest_min(self, participants: int) -> int:
        """t - c for a round of ``participants`` clients (AggregationConfigError when that round is invalid)."""
        return self.aggregation.resolve_threshold(participants) - self.aggregation.max_colluders

    def _rng(self, round_id: int, party: str) -> np.random.Generator | None:
        if self.noise_seed is None:
            return None
        return noise_rng([self.noise_seed, round_id, int.from_bytes(hashlib.sha256(party.encode()).digest()[:8],
                                                                     "little")])

    def noised_a(self, vec: np.ndarray, spec: StatsSpec, participants: int, round_id: int, party: str) -> np.ndarray:
        """A client's round-A vector plus its noise share (int64 (dim_a,))."""
        return vec + self.plan.noise(release_a(spec), self.honest_min(participants), self._rng(round_id, party))

    def noised_b(self, vec: np.ndarray, spec: StatsSpec, bits: int, participants: int, round_id: int,
                 party: str) -> np.ndarray:
        """A client's round-B vector plus its shares: sum q's noise at [0::3], sum q^2's at [1::3] (int64)."""
        rng, t_c = self._rng(round_id, party), self.honest_min(participants)
        out = np.array(vec, dtype=np.int64)
        for col, rel in enumerate(releases_b(spec, bits)):
            out[col::3] += self.plan.noise(rel, t_c, rng)
        return out

    def count_slack(self, spec: StatsSpec, participants: int) -> float:
        """How far below the true row count the noise may put the noised one (10 std of the most it carries)."""
        return self.plan.noise_bound(release_a(spec), participants, self.honest_min(participants), _SIGMAS)

    def moment_bits(self, spec: StatsSpec, noisy_rows: int, participants_a: int, participants_b: int) -> int:
        """b of round B under DP: the largest b whose sum q^2 (true rows bounded by the noised count plus
        :meth:`count_slack`, plus 10 std of its noise) stays an exact integer (:func:`moment_bits`) and
        whose Poisson means stay below 2^40. Raises StatsError below :data:`MIN_BITS`."""
        m, z, t_c = len(spec.numeric), self.plan.noise_multiplier, self.honest_min(participants_b)
        # sum q^2's noise std over 4^b, independent of b: z sqrt(m) sqrt(participants / (t - c))
        rows = max(noisy_rows, 1) + self.count_slack(spec, participants_a) + \
            _SIGMAS * z * math.sqrt(m * participants_b / t_c)
        b = moment_bits(math.ceil(rows))
        while b >= MIN_BITS and (z * 4.0 ** b) ** 2 * m / t_c / 2 > MAX_POISSON_MEAN:
            b -= 1
        if b < MIN_BITS:
            raise StatsError(f"the moments' noise (noise multiplier {z:.3g}, {m} numeric columns) leaves fewer "
                             f"than {MIN_BITS} bits: lower the noise or the number of columns")
        return b

    def account(self, spec: StatsSpec, survivors_a: int, participants_a: int, bits: int | None,
                survivors_b: int, participants_b: int) -> dict:
        """The job's record: round A at survivors_a, round B's releases (at ``bits``; None: no round B) at
        survivors_b; with ``noise_std`` (the summed noise's std per release, integer units). ValueError when a
        round kept fewer honest survivors than its threshold allows."""
        acc, c = SumAccountant(self.plan), self.aggregation.max_colluders
        rounds = [(release_a(spec), survivors_a, participants_a)]
        if bits is not None:
            rounds += [(r, survivors_b, participants_b) for r in releases_b(spec, bits)]
        std = {}
        for rel, s, n in rounds:
            t_c = self.honest_min(n)
            acc.step(rel, self.plan.honest_variance(rel, s, t_c, c))
            std[rel.name] = math.sqrt(s * self.plan.share(rel, t_c))
        return {**acc.record(), "noise_std": std}
