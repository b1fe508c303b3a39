"""Privacy accounting: ε(δ) of client-level DP-FedAvg, of distributed Skellam noise, and of record-level DP-SGD.

Three guarantees, each stated for a different unit of privacy and neighbouring relation:

* :class:`ClientLevelAccountant` -- DP-FedAvg (McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private
  Recurrent Language Models", ICLR 2018, Algorithm 1 and Section 3): every client update is clipped to L2 norm
  ``clip_norm`` and the *sum* of one round's updates receives Gaussian noise of standard deviation
  ``noise_multiplier * clip_norm`` per coordinate. Neighbouring datasets add or remove one client's whole data, so
  the L2 sensitivity of the sum is ``clip_norm`` and one round is the Gaussian mechanism with noise multiplier
  ``z``. Rounds compose; client sampling is accounted as Poisson subsampling only when asked (see the class).
  The ε and δ are computed by Google's ``dp_accounting`` (RDP: Mironov, "Rényi Differential Privacy", CSF 2017;
  Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530,
  Section 3; RDP -> (ε, δ) by Canonne, Kamath, Steinke, arXiv:2004.00010, Proposition 12. PLD: privacy loss
  distributions with pessimistic discretisation, Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the Dots",
  PETS 2022). Nothing here re-derives what the library computes: this module builds ``DpEvent`` objects and asks.
* :func:`skellam_rdp` / :class:`SkellamAccountant` -- distributed noise inside secure aggregation: the Skellam
  mechanism (Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially Private Federated Learning",
  NeurIPS 2021, arXiv:2110.04995). Its RDP bound is not in ``dp_accounting``, so it is evaluated here in closed
  form (Section 3, Theorem 3.5, the multi-dimensional Skellam RDP bound), summed over rounds (RDP composes by
  addition, Mironov 2017 Proposition 1) and converted with ``dp_accounting.rdp.compute_epsilon``.
* :func:`dpsgd_epsilon` -- record-level DP-SGD at a client (Abadi et al., "Deep Learning with Differential
  Privacy", CCS 2016), accounted by Opacus's own ``RDPAccountant`` (Yousefpour et al., arXiv:2109.12298).

Units everywhere: ε is in nats (the exponent of e in the DP definition), δ is a probability in (0, 1); noise
multipliers are the ratio of the noise standard deviation to the L2 sensitivity (dimensionless); the Skellam
``variance`` is the per-coordinate variance of the *summed* noise in the quantised integer domain (integer units
squared), and its sensitivities are in the same integer units.

What each role learns: an (ε, δ) here bounds what anyone who sees the released noised aggregates (the server under
the distributed placement, every client through the global model, whoever receives the released model) can learn
about the unit (one client, or one record). It says nothing about a party that sees an un-noised sum: under the
central placement the server sees the sum before it adds the noise, and is trusted with it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import math
import operator
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import dp_accounting

ACCOUNTANTS = ("rdp", "pld")
# cap of rounds_within's search: ε grows without bound in the rounds, but a huge noise multiplier can push the
# crossing past any practical number of rounds
MAX_ROUNDS = 10**6
# noise multipliers below this are not searched by noise_multiplier_for (the Gaussian mechanism there is
# essentially no noise; a target met at this z says "no noise needed", which is reported as an error)
Z_FLOOR = 1e-3
# Theorem 3.5 of Agarwal et al. 2021 holds for integer orders α > 1 only
SKELLAM_ORDERS = tuple(range(2, 64)) + tuple(range(64, 257, 8)) + (320, 384, 512, 768, 1024)


def library():
    """Google's ``dp_accounting`` with its ``rdp`` and ``pld`` modules, imported on first use: at module level it
    added about a second to the start-up of every party process, DP or not (the job registry imports this)."""
    import dp_accounting.pld
    import dp_accounting.rdp

    return dp_accounting


# ------------------------------------------------------------------------------------------ validation
def _positive(value, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (out > 0 and math.isfinite(out)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return out


def _delta(value, name: str = "delta") -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a probability in (0, 1), got {value!r}") from None
    if not 0 < out < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return out


def _rate(value, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a rate in (0, 1], got {value!r}") from None
    if not 0 < out <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return out


def _count(value, name: str) -> int:
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}") from None
    if out < 0 or isinstance(value, bool):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return out


def _accountant_kind(value, name: str = "accountant") -> str:
    if value not in ACCOUNTANTS:
        raise ValueError(f"{name} must be one of {ACCOUNTANTS}, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ per-round accounting
class _RoundAccountant(ABC):
    """What every per-round accountant shares: a count of rounds done, the budget stop and the largest number of
    rounds within a budget. Subclasses define ``rounds`` and ``epsilon(delta, rounds)``, non-decreasing in
    ``rounds``."""

    rounds: int

    @abstractmethod
    def epsilon(self, delta: float, rounds: int | None = None) -> float:
        """ε at ``delta`` after ``rounds`` rounds (default: those recorded); non-decreasing in ``rounds``."""

    def would_exceed(self, budget_epsilon: float, delta: float, next_round: int | None = None) -> bool:
        """True when running round ``next_round`` (1-based; default: the round after those recorded) would take ε
        at ``delta`` above ``budget_epsilon``: the job must stop *before* that round.

        Raises ValueError naming ``budget_epsilon``, ``delta`` or ``next_round`` when out of range."""
        budget = _positive(budget_epsilon, "budget_epsilon")
        k = self.rounds + 1 if next_round is None else _count(next_round, "next_round")
        return self.epsilon(delta, k) > budget

    def rounds_within(self, epsilon: float, delta: float, max_rounds: int = MAX_ROUNDS) -> int:
        """The largest number of rounds T with ε(T) ≤ ``epsilon`` at ``delta`` (0 if even one round exceeds it),
        found by doubling then integer bisection on the library's ε; capped at ``max_rounds`` (a return equal to
        the cap means "at least that many"). Assumes ε non-decreasing in the rounds, which holds for composition.

        Raises ValueError naming ``epsilon``, ``delta`` or ``max_rounds`` when out of range."""
        budget = _positive(epsilon, "epsilon")
        delta = _delta(delta)
        cap = _count(max_rounds, "max_rounds")
        if cap < 1:
            raise ValueError(f"max_rounds must be at least 1, got {max_rounds!r}")
        ok, bad = 0, 1  # ε(ok) ≤ budget; bad is the next candidate
        while self.epsilon(delta, bad) <= budget:
            if bad >= cap:
                return cap
            ok, bad = bad, min(2 * bad, cap)
        while bad - ok > 1:  # ε(ok) ≤ budget < ε(bad)
            mid = (ok + bad) // 2
            ok, bad = (mid, bad) if self.epsilon(delta, mid) <= budget else (ok, mid)
        return ok


class ClientLevelAccountant(_RoundAccountant):
    """Client-level (ε, δ) of DP-FedAvg with Gaussian noise, composed over rounds (McMahan et al., ICLR 2018).

    One round: each client's update clipped to L2 norm ``clip_norm``; the sum of the round's updates receives
    N(0, (noise_multiplier * clip_norm)^2) per coordinate. Neighbouring relation: add or remove one client
    (``dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE``). The sensitivity of the sum is ``clip_norm``, so the
    round is ``GaussianDpEvent(noise_multiplier)``; T rounds are ``SelfComposedDpEvent(event, T)``.

    Client sampling. With ``amplification=True`` each round is ``PoissonSampledDpEvent(sampling_rate, ...)``:
    privacy amplification by subsampling (Mironov, Talwar, Zhang 2019; Balle, Barthe, Gaboardi, NeurIPS 2018).
    Claim it only when every client joins each round independently with probability ``sampling_rate``, by its
    own coin, and the server cannot tell who was sampled: the amplification comes from the adversary's
    uncertainty about whether the target client is in the sum. A server that chooses the participants, or
    learns who they are (it sees who sends a masked update), can put the target client in every round, and then
    each round is a full Gaussian mechanism on that client. So with ``amplification=False`` (the default)
    ``sampling_rate`` is recorded but every round is accounted as ``GaussianDpEvent(noise_multiplier)``, as if the
    client took part in all of them.

    Args:
        noise_multiplier: z > 0, noise standard deviation over ``clip_norm`` (dimensionless).
        clip_norm: C > 0, the L2 clip of one client's update (the update's units).
        sampling_rate: q in (0, 1], the probability that a client takes part in a round.
        amplification: account q as secret Poisson subsampling (see above).
        accountant: ``"rdp"`` (``dp_accounting.rdp.RdpAccountant``, default orders) or ``"pld"``
            (``dp_accounting.pld.PLDAccountant``; tighter, slower: its time and memory grow with the privacy loss
            range, roughly like rounds / z², so a large ε over many unsampled rounds takes seconds, and a tiny z
            can exhaust memory; use RDP below z ≈ 0.1).
        pld_discretization: the PLD accountant's ``value_discretization_interval`` (the library's default 1e-4).

    Raises:
        ValueError naming the argument: z ≤ 0, C ≤ 0, q outside (0, 1], an unknown accountant.
    """

    def __init__(self, noise_multiplier: float, clip_norm: float, sampling_rate: float = 1.0,
                 amplification: bool = False, accountant: str = "rdp", pld_discretization: float = 1e-4):
        self.noise_multiplier = _positive(noise_multiplier, "noise_multiplier")
        self.clip_norm = _positive(clip_norm, "clip_norm")
        self.sampling_rate = _rate(sampling_rate, "sampling_rate")
        self.amplification = bool(amplification)
        self.accountant = _accountant_kind(accountant)
        self.pld_discretization = _positive(pld_discretization, "pld_discretization")
        self._rounds = 0

    @property
    def rounds(self) -> int:
        """Rounds recorded by :meth:`step` (the rounds whose noised aggregate was released)."""
        return self._rounds

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on the sum, per coordinate (the update's units): z * C."""
        return self.noise_multiplier * self.clip_norm

    def step(self, rounds: int = 1) -> None:
        """Record ``rounds`` more released rounds."""
        self._rounds += _count(rounds, "rounds")

    def round_event(self) -> dp_accounting.DpEvent:
        """The ``dp_accounting`` event of one round (Poisson-subsampled only under amplification with q < 1)."""
        gaussian = library().GaussianDpEvent(self.noise_multiplier)
        if self.amplification and self.sampling_rate < 1:
            return library().PoissonSampledDpEvent(self.sampling_rate, gaussian)
        return gaussian

    def epsilon(self, delta: float, rounds: int | None = None, accountant: str | None = None) -> float:
        """ε (nats) at ``delta`` after ``rounds`` rounds (default: those recorded), 0.0 for no rounds.

        ``accountant`` overrides the instance's choice for this call. Raises ValueError naming ``delta``,
        ``rounds`` or ``accountant`` when out of range."""
        delta = _delta(delta)
        k = self._rounds if rounds is None else _count(rounds, "rounds")
        kind = self.accountant if accountant is None else _accountant_kind(accountant)
        if k == 0:
            return 0.0
        if kind == "rdp":
            acc = library().rdp.RdpAccountant()
        else:
            acc = library().pld.PLDAccountant(value_discretization_interval=self.pld_discretization)
        acc.compose(library().SelfComposedDpEvent(self.round_event(), k))
        return float(acc.get_epsilon(delta))

    def record(self, delta: float, rounds: int | None = None) -> dict:
        """The guarantee as a JSON-ready dict, for ``metrics.json``, the job page and the model bundle: mechanism,
        unit, noise_multiplier, clip_norm, noise_std, sampling_rate, amplification, rounds, epsilon, delta,
        accountant."""
        k = self._rounds if rounds is None else _count(rounds, "rounds")
        return {"mechanism": "gaussian", "unit": "client", "noise_multiplier": self.noise_multiplier,
                "clip_norm": self.clip_norm, "noise_std": self.noise_std, "sampling_rate": self.sampling_rate,
                "amplification": self.amplification, "rounds": k, "epsilon": self.epsilon(delta, k),
                "delta": _delta(delta), "accountant": self.accountant}


def noise_multiplier_for(epsilon: float, delta: float, rounds: int, sampling_rate: float = 1.0,
                         amplification: bool = False, accountant: str = "rdp", tol: float = 1e-5,
                         pld_discretization: float = 1e-4) -> float:
    """The smallest noise multiplier z (up to ``tol``) whose ``rounds`` rounds of :class:`ClientLevelAccountant`
    stay within (``epsilon``, ``delta``).

    Calibration is ``dp_accounting.calibrate_dp_mechanism`` (Brent's method with a bisection fallback) on the
    library's ε. Tolerance: the result z satisfies ε(z) ≤ ``epsilon`` and z - z* ≤ ``tol`` where z* is the exact
    minimal multiplier (z is absolute, dimensionless; the default 1e-5 moves ε by about 1e-5 relative near z ≈ 1).
    The PLD search is bracketed around the RDP answer, which keeps it off tiny z, where the privacy loss
    distribution becomes huge.

    Raises:
        ValueError naming the argument: ``epsilon`` ≤ 0, ``delta`` outside (0, 1), ``rounds`` < 1,
        ``sampling_rate`` outside (0, 1], ``tol`` ≤ 0, an unknown ``accountant``; or when the target is met even
        at ``Z_FLOOR`` (no noise needed, e.g. heavy secret subsampling with a large ε).
    """
    target, delta, tol = _positive(epsilon, "epsilon"), _delta(delta), _positive(tol, "tol")
    k = _count(rounds, "rounds")
    if k < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds!r}")
    kind = _accountant_kind(accountant)

    def account(z: float, how: str) -> ClientLevelAccountant:
        return ClientLevelAccountant(z, 1.0, sampling_rate, amplification, how, pld_discretization)

    def calibrate(how: str, bracket) -> float:
        return float(library().calibrate_dp_mechanism(
            lambda: (library().rdp.RdpAccountant() if how == "rdp"
                     else library().pld.PLDAccountant(value_discretization_interval=pld_discretization)),
            lambda z: library().SelfComposedDpEvent(account(z, how).round_event(), k),
            target, delta, bracket, tol=tol))

    if account(Z_FLOOR, "rdp").epsilon(delta, k) <= target:
        raise ValueError(f"epsilon={target} is met at delta={delta} over {k} rounds even with noise_multiplier "
                         f"{Z_FLOOR}: no calibration is meaningful")
    z_rdp = calibrate("rdp", library().LowerEndpointAndGuess(Z_FLOOR, 1.0))
    if kind == "rdp":
        return z_rdp
    # PLD is tighter than RDP: its z* lies below z_rdp, and in practice above half of it. The search goes no
    # lower than z_rdp / 16, since the PLD's memory grows like 1 / z² (38 GiB at z = 1e-3)
    lo, hi = z_rdp / 2, z_rdp
    while account(lo, "pld").epsilon(delta, k) <= target:
        if lo <= z_rdp / 16:
            raise ValueError(f"the PLD noise multiplier for epsilon={target} is below {lo:.3g}, a sixteenth of the "
                             f"RDP one ({z_rdp:.3g}); use accountant='rdp'")
        lo /= 2
    while account(hi, "pld").epsilon(delta, k) > target:
        hi *= 2
    return calibrate("pld", library().ExplicitBracketInterval(lo, hi))


# ------------------------------------------------------------------------------------------ Skellam
def skellam_rdp(variance: float, l2_sensitivity: float, l1_sensitivity: float,
                orders: Sequence[int] = SKELLAM_ORDERS) -> np.ndarray:
    """RDP ε(α) of one release of the multi-dimensional Skellam mechanism, at each integer order α > 1.

    Agarwal, Kairouz, Liu, NeurIPS 2021 (arXiv:2110.04995), Section 3, Theorem 3.5: adding to an integer vector
    with L2 sensitivity Δ2 and L1 sensitivity Δ1 independent symmetric Skellam noise of per-coordinate variance μ
    (each coordinate Poisson(μ/2) - Poisson(μ/2), pmf e^{-μ} I_k(μ)) is (α, ε(α))-RDP with

        ε(α) = α Δ2² / (2μ) + min( ((2α - 1) Δ2² + 6 Δ1) / (4μ²),  3 Δ1 / (2μ) ).

    The first term is the Gaussian mechanism's RDP at the same variance; the min is the price of discreteness and
    vanishes relative to it as μ grows.

    Why Skellam rather than the discrete Gaussian (Kairouz, Liu, Steinke, ICML 2021): Skellam is closed under
    summation, Sk(μ1) + Sk(μ2) = Sk(μ1 + μ2), so whatever set of clients survives, the unmasked sum carries an
    *exact* Skellam of the survivors' summed variance, and this bound applies to it as is. The sum of discrete
    Gaussians is not a discrete Gaussian; its guarantee needs a separate, looser analysis that depends on how
    many shares were summed, which makes dropout-robust calibration approximate.

    Args:
        variance: μ > 0, the per-coordinate variance of the *summed* noise, in the quantised integer domain
            (scale² times the float-domain variance).
        l2_sensitivity: Δ2 > 0, the L2 sensitivity of the scaled, rounded sum to adding or removing one client
            (integer units: after scaling, rotation and conditional randomised rounding).
        l1_sensitivity: Δ1 ≥ Δ2, its L1 sensitivity in the same units (Δ1 ≤ sqrt(d) Δ2 for dimension d).
        orders: integer RDP orders α ≥ 2.

    Returns:
        float64 array, shape (len(orders),): ε(α) in nats for one release.

    Raises:
        ValueError naming the argument: non-positive variance or sensitivity, Δ1 < Δ2, a non-integer order or one
        below 2.
    """
    mu = _positive(variance, "variance")
    d2 = _positive(l2_sensitivity, "l2_sensitivity")
    d1 = _positive(l1_sensitivity, "l1_sensitivity")
    if d1 < d2 * (1 - 1e-12):  # ||x||_1 >= ||x||_2 for every vector, so a smaller Δ1 is a caller's error
        raise ValueError(f"l1_sensitivity ({d1}) must be at least l2_sensitivity ({d2})")
    alpha = _skellam_orders(orders)
    tail = np.minimum(((2 * alpha - 1) * d2**2 + 6 * d1) / (4 * mu**2), 3 * d1 / (2 * mu))
    return alpha * d2**2 / (2 * mu) + tail


def _skellam_orders(orders: Sequence[int]) -> np.ndarray:
    alpha = np.asarray(orders, dtype=np.float64)
    if alpha.ndim != 1 or alpha.size == 0 or np.any(alpha < 2) or np.any(alpha != np.round(alpha)):
        raise ValueError(f"orders must be integers >= 2 (Theorem 3.5 holds for integer orders), got {orders!r}")
    return alpha


def skellam_epsilon(variance: float, l2_sensitivity: float, l1_sensitivity: float, delta: float,
                    rounds: int = 1, orders: Sequence[int] = SKELLAM_ORDERS) -> float:
    """ε (nats) at ``delta`` of ``rounds`` Skellam releases of per-coordinate variance ``variance`` (integer
    domain), each with the given sensitivities: RDP of :func:`skellam_rdp` times ``rounds`` (composition adds
    RDP), converted by ``dp_accounting.rdp.compute_epsilon`` (Canonne, Kamath, Steinke, arXiv:2004.00010,
    Proposition 12). No amplification by client sampling is claimed. Raises ValueError naming the argument."""
    k, delta = _count(rounds, "rounds"), _delta(delta)
    rdp = skellam_rdp(variance, l2_sensitivity, l1_sensitivity, orders) * k
    return 0.0 if k == 0 else float(library().rdp.compute_epsilon(list(orders), rdp, delta)[0])


def skellam_variance_for(epsilon: float, delta: float, rounds: int, l2_sensitivity: float,
                         l1_sensitivity: float, rtol: float = 1e-6,
                         orders: Sequence[int] = SKELLAM_ORDERS) -> float:
    """The smallest per-coordinate variance μ of the summed Skellam noise (integer domain) whose ``rounds``
    releases stay within (``epsilon``, ``delta``), by bisection in log μ on :func:`skellam_epsilon` (exactly
    monotone: every term of the bound decreases in μ). Tolerance: the result μ has ε(μ) ≤ ``epsilon`` and
    μ ≤ μ* (1 + ``rtol``). Spreading it over clients (each adds variance μ / n_min for the fewest survivors
    allowed) is the mechanism's business. Raises ValueError naming the argument."""
    target, rtol = _positive(epsilon, "epsilon"), _positive(rtol, "rtol")
    k = _count(rounds, "rounds")
    if k < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds!r}")

    def eps(mu: float) -> float:
        return skellam_epsilon(mu, l2_sensitivity, l1_sensitivity, delta, k, orders)

    hi = _positive(l2_sensitivity, "l2_sensitivity") ** 2
    while eps(hi) > target:
        hi *= 2
    lo = hi / 2
    while eps(lo) <= target:
        lo /= 2
    while hi / lo - 1 > rtol:  # ε(lo) > target ≥ ε(hi)
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= target else (mid, hi)
    return hi


class SkellamAccountant(_RoundAccountant):
    """Client-level (ε, δ) of distributed Skellam noise over rounds, with the variance each round really carried.

    ``variance`` is the nominal per-coordinate variance of the summed noise (integer domain): the least that any
    surviving set allowed by the secure-aggregation threshold carries. :meth:`step` records each released round
    with the variance its survivors actually carried (more survivors, more noise); rounds not recorded yet count
    at the nominal variance. RDP of every round (:func:`skellam_rdp`) is summed and converted with
    ``dp_accounting.rdp.compute_epsilon``. Neighbouring relation: add or remove one client (``unit``; one record
    for distributed record-level DP-GD, whose sensitivities are a record's). No amplification by
    client sampling is claimed (the library has no subsampling bound for this RDP curve).

    Raises ValueError naming the argument (see :func:`skellam_rdp`).
    """

    accountant = "rdp"

    def __init__(self, variance: float, l2_sensitivity: float, l1_sensitivity: float,
                 orders: Sequence[int] = SKELLAM_ORDERS, unit: str = "client"):
        self._nominal_rdp = skellam_rdp(variance, l2_sensitivity, l1_sensitivity, orders)
        self.variance = float(variance)
        self.l2_sensitivity, self.l1_sensitivity = float(l2_sensitivity), float(l1_sensitivity)
        self.orders = tuple(int(a) for a in orders)
        self.unit = unit  # what one neighbouring step adds or removes: a client's update, or one record
        self.variances: list[float] = []  # per recorded round, the variance the survivors carried
        self._rdp = np.zeros(len(self.orders))  # RDP of the recorded rounds

    @property
    def rounds(self) -> int:
        """Rounds recorded by :meth:`step`."""
        return len(self.variances)

    def step(self, variance: float | None = None) -> None:
        """Record one released round whose summed noise had per-coordinate ``variance`` (default: nominal).
        Raises ValueError naming ``variance`` when it is not positive or is below the nominal one (the
        calibration promised at least the nominal variance; less means the round was accounted wrongly)."""
        mu = self.variance if variance is None else _positive(variance, "variance")
        if mu < self.variance * (1 - 1e-12):
            raise ValueError(f"variance {mu} is below the nominal {self.variance}: the round carried less noise "
                             f"than calibrated")
        self.variances.append(mu)
        self._rdp += skellam_rdp(mu, self.l2_sensitivity, self.l1_sensitivity, self.orders)

    def epsilon(self, delta: float, rounds: int | None = None) -> float:
        """ε (nats) at ``delta`` after ``rounds`` rounds (default: those recorded): the recorded rounds, then
        nominal ones; with ``rounds`` below the recorded count, the first ``rounds`` recorded ones."""
        delta = _delta(delta)
        k = self.rounds if rounds is None else _count(rounds, "rounds")
        if k == 0:
            return 0.0
        if k >= self.rounds:
            rdp = self._rdp + (k - self.rounds) * self._nominal_rdp
        else:
            rdp = sum(skellam_rdp(mu, self.l2_sensitivity, self.l1_sensitivity, self.orders)
                      for mu in self.variances[:k])
        return float(library().rdp.compute_epsilon(list(self.orders), rdp, delta)[0])

    def record(self, delta: float, rounds: int | None = None) -> dict:
        """JSON-ready dict: mechanism, unit, variance (nominal), min_variance_carried, l2_sensitivity,
        l1_sensitivity, rounds, epsilon, delta, accountant."""
        k = self.rounds if rounds is None else _count(rounds, "rounds")
        carried = self.variances[:k]
        return {"mechanism": "skellam", "unit": self.unit, "variance": self.variance,
                "min_variance_carried": min(carried) if carried else None,
                "l2_sensitivity": self.l2_sensitivity, "l1_sensitivity": self.l1_sensitivity, "rounds": k,
                "epsilon": self.epsilon(delta, k), "delta": _delta(delta), "accountant": self.accountant}


# ------------------------------------------------------------------------------------------ record-level DP-SGD
def dpsgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  alphas: Sequence[float] | None = None) -> float:
    """Record-level ε (nats) at ``delta`` of DP-SGD at one client, by Opacus's ``RDPAccountant``.

    DP-SGD (Abadi et al., CCS 2016, Algorithm 1): each step Poisson-samples records with probability
    ``sample_rate``, clips per-example gradients to norm C and adds N(0, (noise_multiplier * C)^2); neighbouring
    datasets add or remove one record. The accountant is filled the way Opacus's own
    ``opacus.accountants.utils.get_noise_multiplier`` does (one history entry of (z, q, steps)), and ε is its
    ``get_epsilon`` (RDP of the sampled Gaussian mechanism, Mironov, Talwar, Zhang 2019; conversion Balle et al.,
    AISTATS 2020, Theorem 21). ``alphas``: RDP orders, default Opacus's ``RDPAccountant.DEFAULT_ALPHAS``.

    Opacus (and torch) are imported on first call only, so the rest of this module does not need them.

    Raises:
        ValueError naming the argument: z ≤ 0, q outside (0, 1], negative steps, delta outside (0, 1).
    """
    z = _positive(noise_multiplier, "noise_multiplier")
    q = _rate(sample_rate, "sample_rate")
    k = _count(steps, "steps")
    delta = _delta(delta)
    if k == 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(z, q, k)]
    return float(acc.get_epsilon(delta=delta, alphas=None if alphas is None else list(alphas)))
