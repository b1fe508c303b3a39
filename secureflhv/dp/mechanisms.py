"""Client-side mechanism of distributed differential privacy: clip, rotate, scale, round, add Skellam noise.

What each client does to its update before secure aggregation, after Kairouz, Liu and Steinke, "The
Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation" (ICML 2021,
Algorithms 1 and 2) and Agarwal, Kairouz and Liu, "The Skellam Mechanism for Differentially Private
Federated Learning" (NeurIPS 2021, Algorithm 1), with Skellam noise:

1. clip x (float64, (d,)) to L2 norm ``clip``                                    :func:`clip_l2`
2. pad to d' = 2^ceil(log2 d), flip signs by public random ±1, normalised
   Walsh-Hadamard transform (an orthogonal rotation)                             :func:`rotate`
3. divide by ``gamma`` and round stochastically, redrawing until the L2 norm
   of the integer vector is within the bound of the papers                       :func:`scale_and_round`
4. add the client's share of Skellam noise (integer, variance ``mu``)            :func:`skellam_noise`
5. reduce mod 2^k for secure aggregation                                         :func:`encode` does 1-5
The server, after unmasking the survivors' sum mod 2^k: centre, times gamma, unrotate, cut to d
(:func:`decode`). Dropout-robust calibration: :func:`share_variance`, :func:`carried_variance`; the ring:
:func:`modulus_bits`; the sensitivity the accountant needs: :func:`sensitivity`.

Why Skellam rather than the discrete Gaussian: a sum of independent Skellams is exactly Skellam (variances
add), so whichever clients survive, the noise in the sum has an exactly known distribution and the
dropout-robust calibration is exact; a sum of discrete Gaussians is only close to a discrete Gaussian, and
the DDG guarantee pays an extra term that grows with the number of clients (Kairouz et al., Thm. 1).
Agarwal et al. (Sec. 5) report Skellam on par with DDG at the same bits per coordinate, the sampler is a
difference of two Poissons, and its RDP has a closed form (their Thm. 3.5 / Cor. 3.6).

Units: x, clip and the decoded sum are in model units; gamma is model units per integer step; mu is the
variance of the integer noise (integer units squared): a Gaussian-equivalent std sigma in model units is
mu = (sigma / gamma) ** 2. The padding: zeros are appended to reach d' before the rotation; after
unrotation the padded coordinates hold only noise and rounding error, and :func:`decode` drops them. The
bound, the noise and the wire cost are over d' coordinates (``bits_per_coordinate`` counts them).

Randomness, and who learns what:
- the rotation signs come from a PUBLIC seed (:func:`rotation_seed`, from the job seed and the round) that
  every client and the server share; the rotation hides nothing, it spreads x evenly over the coordinates so
  that rounding and the modulus cost few bits;
- the rounding and the noise come from a client's SECRET generator (:func:`noise_rng`, 128 bits of OS
  entropy), never from the job seed: whoever knew a client's noise could subtract it. The server learns only
  the sum over the survivors, which carries noise of variance (number of survivors) * mu.

The sampler's limits, stated plainly: numpy's Generator is PCG64, which is not a cryptographically secure
generator (its seed can be recovered from a few hundred bytes of consecutive output, Bouillaguet, Martinez
and Sauvage, ToSC 2020; no party sees raw output here, only noise added to x and masked); numpy's Poisson
sampler computes in float64 (multiplication method below lambda 10, PTRS transformed rejection above), so
its pmf is exact only up to float rounding and its running time depends on the value drawn. This is the
choice of Opacus's non-secure mode (``secure_mode=False``). ``skellam_noise(..., secure=True)`` seeds a
fresh PCG64 from :mod:`secrets` for every call, so no long-lived generator state holds past or future noise:
the framework should use ``secure=True`` in production, and seeded generators only in tests.
"""
from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from secureflhv.crypto.quantise import MAX_K_BITS

BETA = math.exp(-0.5)  # conditional-rounding parameter: TFF's default (google-research/federated, distributed_dp)
_NORM_SLACK = 1e-9  # float norms are trusted to this relative error (d * eps for d up to 2^23)
_ROTATION_DOMAIN = int.from_bytes(hashlib.sha256(b"secureflhv/dp/rotation").digest()[:8], "little")

__all__ = ["BETA", "Encoded", "RingBits", "carried_variance", "clip_l2", "decode", "encode", "l2_bound",
           "modulus_bits", "noise_rng", "padded_dim", "rotate", "rotation_seed", "scale_and_round",
           "sensitivity", "share_variance", "skellam_noise", "skellam_tail", "unrotate"]


def _vector(x, name: str = "x") -> np.ndarray:
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D vector, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} has non-finite values")
    return v


def _positive(value: float, name: str) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return value


def _norm(v: np.ndarray) -> float:
    """L2 norm without overflow (scaled by the largest magnitude)."""
    top = float(np.max(np.abs(v), initial=0.0))
    return 0.0 if top == 0.0 else top * float(np.linalg.norm(v / top))


def clip_l2(x, c: float) -> tuple[np.ndarray, bool]:
    """Scale ``x`` down to L2 norm at most ``c`` (DP-FedAvg, McMahan et al. ICLR 2018, Alg. 1).

    Args:
        x: float vector, shape (d,).
        c: the clip norm, positive, in the units of x.

    Returns:
        (float64 copy of x times min(1, c / ||x||), whether it was scaled down). The norm is <= c up to float
        rounding (relative 1e-15).

    Raises:
        ValueError: x not a non-empty finite 1-D vector, or c not positive and finite.
    """
    v, c = _vector(x).copy(), _positive(c, "clip")
    norm = _norm(v)
    if norm <= c:
        return v, False
    return v * (c / norm), True


def padded_dim(d: int) -> int:
    """d' = the smallest power of two >= d (the length of the rotated vector); d >= 1."""
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    return 1 << (d - 1).bit_length()


def rotation_seed(job_seed: int, round_id: int, stream: int = 0) -> tuple[int, int, int, int]:
    """The PUBLIC seed of the rotation of one round: every client and the server derive the same one.

    ``stream`` separates several vectors rotated in the same round (e.g. model and histograms); a
    domain constant keeps it apart from every other use of the job seed. Non-negative ints only.
    """
    if min(job_seed, round_id, stream) < 0:
        raise ValueError(f"seed parts must be non-negative, got {job_seed}, {round_id}, {stream}")
    return (_ROTATION_DOMAIN, int(job_seed), int(round_id), int(stream))


def _signs(seed, n: int) -> np.ndarray:
    if seed is None or isinstance(seed, (np.random.Generator, np.random.BitGenerator)):
        # None would draw fresh signs and a Generator would advance: unrotate could not invert rotate
        raise TypeError("the rotation seed must be an int, a sequence of ints or a SeedSequence")
    return np.random.default_rng(seed).integers(0, 2, size=n, dtype=np.int8) * 2.0 - 1.0


def _fwht(a: np.ndarray) -> np.ndarray:
    """Unnormalised fast Walsh-Hadamard transform (Sylvester order) along the last axis, in place.

    log2(n) vectorised butterfly passes, O(n log n); H_n H_n = n I.
    """
    n = a.shape[-1]
    h = 1
    while h < n:
        v = a.reshape(*a.shape[:-1], n // (2 * h), 2, h)  # a view: writes land in a
        top = v[..., 0, :].copy()
        v[..., 0, :] += v[..., 1, :]
        v[..., 1, :] = top - v[..., 1, :]
        h *= 2
    return a


def rotate(x, seed) -> np.ndarray:
    """Randomised Hadamard rotation: y = H D pad(x) / sqrt(d') (Kairouz et al., Sec. 4, "flattening").

    Args:
        x: float array, shape (..., d); the rotation acts on the last axis.
        seed: the PUBLIC rotation seed (:func:`rotation_seed`); an int, a sequence of ints or a SeedSequence.

    Returns:
        float64, shape (..., d'), d' = :func:`padded_dim` (d): x padded with zeros at the end, multiplied by
        the seed's ±1 diagonal D, then by the normalised Hadamard matrix. Orthogonal: the L2 norm is kept.

    Raises:
        TypeError: seed is None or a Generator (the server could not redo the same rotation).
    """
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    n = padded_dim(d)
    padded = np.zeros(x.shape[:-1] + (n,))
    padded[..., :d] = x
    padded *= _signs(seed, n)
    return _fwht(padded) / math.sqrt(n)


def unrotate(y, seed, d: int | None = None) -> np.ndarray:
    """Inverse of :func:`rotate` (up to float rounding): D H y / sqrt(d'), cut to the first ``d`` coordinates.

    Args:
        y: float array, shape (..., d') with d' a power of two.
        seed: the same public seed that :func:`rotate` used.
        d: keep the first d coordinates (the unpadded length); None keeps all d'.

    Raises:
        ValueError: d' not a power of two, or d > d'.
    """
    y = np.array(y, dtype=np.float64)  # a copy: _fwht works in place
    n = y.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"the rotated length must be a power of two, got {n}")
    if d is not None and not 1 <= d <= n:
        raise ValueError(f"d must be in [1, {n}], got {d}")
    x = _fwht(y) * (_signs(seed, n) / math.sqrt(n))
    return x if d is None else x[..., :d]


def l2_bound(clip: float, gamma: float, dim: int, beta: float = BETA) -> float:
    """The L2 bound that conditional randomised rounding enforces on the integer vector.

    Kairouz et al. (ICML 2021), Algorithm 1 / Sec. 4.1 (also Agarwal et al. 2021, Algorithm 1), with
    c = clip / gamma the scaled clip norm and ``dim`` the rounded vector's length (d' after rotation):

        Delta_2 = min( c + sqrt(dim),  sqrt( c^2 + dim/4 + sqrt(2 ln(1/beta)) * (c + sqrt(dim)/2) ) )

    The first term holds for every rounding (each coordinate moves by < 1); the second holds for a single
    unconditioned rounding with probability >= 1 - beta, so a try is accepted with probability >= 1 - beta.
    beta = 0 keeps only the first term (every try accepted).

    Raises:
        ValueError: clip or gamma not positive and finite, dim < 1, beta outside [0, 1).
    """
    c = _positive(clip, "clip") / _positive(gamma, "gamma")
    if dim < 1 or not 0.0 <= beta < 1.0:
        raise ValueError(f"need dim >= 1 and 0 <= beta < 1, got {dim}, {beta}")
    first = c + math.sqrt(dim)
    if beta == 0.0:
        return first
    second = math.sqrt(c * c + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(dim) / 2))
    return min(first, second)


def sensitivity(clip: float, gamma: float, dim: int, beta: float = BETA) -> tuple[float, float]:
    """(Delta_1, Delta_2): L1 and L2 bounds of one client's rounded integer vector, for the accountant.

    Delta_2 = :func:`l2_bound`; Delta_1 = min(Delta_2^2, sqrt(dim) * Delta_2) (an integer vector has
    |v_j| <= v_j^2, and Cauchy-Schwarz), as Agarwal et al. (2021) use in the Skellam RDP bound (Thm. 3.5).
    These bound one client's contribution (add/remove one client); ``dim`` is d'. Delta_2 carries a relative
    margin of 1e-9 over :func:`l2_bound`, which covers the float error of the norm that :func:`scale_and_round`
    compares with the bound (the margin must not go into the acceptance test itself: at a fine gamma, clip /
    gamma ~ 2^32, 1e-9 of the norm exceeds the room the rounding leaves, and no try would pass). Delta_1 is kept >= Delta_2
    (true of any vector; it only matters for Delta_2 < 1, where the sole integer vector allowed is 0).
    """
    l2 = l2_bound(clip, gamma, dim, beta) * (1 + _NORM_SLACK)
    return max(l2, min(l2 * l2, math.sqrt(dim) * l2)), l2


def scale_and_round(x, gamma: float, beta: float, rng: np.random.Generator, max_tries: int = 100, *,
                    clip: float) -> tuple[np.ndarray, int]:
    """Conditional randomised rounding of x / gamma (Kairouz et al. 2021, Algorithm 1, step 3).

    Each coordinate v = x_j / gamma becomes floor(v) + Bernoulli(v - floor(v)) (unbiased); the whole vector is
    redrawn until its L2 norm is <= :func:`l2_bound` (clip, gamma, d', beta), which is what makes the
    sensitivity Delta_2 hold for every client. A try fails with probability <= beta, so ``max_tries`` = 100
    fails with probability <= beta^100 (1e-22 at the default). The conditioning biases the result slightly
    towards smaller norms (Kairouz et al., Sec. 4.1); the float rounding of the norm is covered by the margin of
    :func:`sensitivity`.

    Args:
        x: the clipped, rotated vector, float, shape (d',), L2 norm <= clip (model units).
        gamma: model units per integer step, positive.
        beta: the rounding parameter in [0, 1) (:data:`BETA`).
        rng: the client's SECRET generator (:func:`noise_rng`).
        max_tries: the most redraws.
        clip: the clip norm x was clipped to (it fixes the public bound).

    Returns:
        (int64 vector, shape (d',), the number of tries used).

    Raises:
        ValueError: x not finite, ||x|| > clip, or gamma so small that the values would not fit in int64.
        RuntimeError: no try within the bound after ``max_tries``.
    """
    v = _vector(x)
    if _norm(v) > _positive(clip, "clip") * (1 + _NORM_SLACK):
        raise ValueError(f"||x|| = {_norm(v)} exceeds clip = {clip}: clip (clip_l2) before rounding")
    bound = l2_bound(clip, gamma, v.size, beta)
    if bound >= 2.0 ** MAX_K_BITS:
        raise ValueError(f"clip / gamma = {clip / gamma} is too large for 64-bit integers: raise gamma")
    v = v / gamma
    low = np.floor(v)
    frac = v - low
    for tries in range(1, max_tries + 1):
        rounded = low + (rng.random(v.size) < frac)
        if _norm(rounded) <= bound:  # the float norm's error is covered by sensitivity()'s margin
            return rounded.astype(np.int64), tries
    raise RuntimeError(f"conditional rounding failed {max_tries} times (beta = {beta}); raise max_tries or beta")


def noise_rng(seed: int | None = None) -> np.random.Generator:
    """A client's SECRET generator for rounding and noise: PCG64 seeded with 128 bits from :mod:`secrets`.

    ``seed`` is for reproducible TESTS only; never pass the job seed (every party knows it, so the noise
    could be subtracted). PCG64 is not a CSPRNG: see the module docstring.
    """
    return np.random.default_rng(secrets.randbits(128) if seed is None else seed)


def skellam_noise(mu: float, size: int, rng: np.random.Generator | None = None, *,
                  secure: bool = False) -> np.ndarray:
    """Symmetric Skellam noise: Poisson(mu/2) - Poisson(mu/2) per coordinate (Agarwal et al. 2021, Sec. 3).

    Mean 0, variance ``mu``; the sum of independent Skellams of variances mu_i is Skellam of variance
    sum(mu_i). (The paper's Sk(mu) is Poisson(mu) - Poisson(mu), variance 2 mu; here mu IS the variance.)

    Args:
        mu: variance, >= 0 (integer units squared); 0 gives zeros.
        size: number of coordinates.
        rng: the client's secret generator (:func:`noise_rng`); must be None when ``secure``.
        secure: draw from a fresh PCG64 seeded from :mod:`secrets` for this call only (what the framework
            should use outside tests).

    Returns:
        int64 vector, shape (size,).

    Raises:
        ValueError: mu negative or not finite, or rng given together with / missing without ``secure``.
    """
    if not (mu >= 0 and math.isfinite(mu)):
        raise ValueError(f"mu must be >= 0 and finite, got {mu}")
    if secure == (rng is not None):
        raise ValueError("pass either rng or secure=True (not both, not neither)")
    gen = np.random.default_rng(secrets.randbits(128)) if secure else rng
    lam = mu / 2
    return (gen.poisson(lam, size) - gen.poisson(lam, size)).astype(np.int64)


def share_variance(target_mu: float, threshold_t: int) -> float:
    """Each client's noise variance so that ANY t or more survivors carry at least ``target_mu``.

    share = target_mu / t: s >= t survivors' Skellams sum to a Skellam of variance s * target_mu / t >=
    target_mu (Kairouz et al. 2021 and Agarwal et al. 2021 calibrate to the expected number of clients; the
    secure-aggregation threshold t is the fewest survivors the server may unmask, so this is the safe choice).
    The price: with n > t survivors the sum carries n / t times the target.

    Raises:
        ValueError: target_mu negative or not finite, threshold_t < 1.
    """
    if not (target_mu >= 0 and math.isfinite(target_mu)) or threshold_t < 1:
        raise ValueError(f"need target_mu >= 0 and threshold_t >= 1, got {target_mu}, {threshold_t}")
    return target_mu / threshold_t


def carried_variance(n_survivors: int, share: float) -> float:
    """The variance of the noise the survivors' sum actually carries: n_survivors * share (integer units)."""
    if n_survivors < 0 or share < 0:
        raise ValueError(f"need n_survivors >= 0 and share >= 0, got {n_survivors}, {share}")
    return n_survivors * share


def skellam_tail(a: float, mu: float) -> float:
    """Chernoff bound on P(Y >= a) for Y symmetric Skellam of variance mu (a >= 0).

    E[e^{tY}] = exp(mu (cosh t - 1)); at t = asinh(a / mu):
        P(Y >= a) <= exp( mu (sqrt(1 + (a/mu)^2) - 1) - a asinh(a / mu) ).
    For large mu this tends to the Gaussian exp(-a^2 / (2 mu)); the tail is heavier for a >> mu.
    """
    if a < 0:
        raise ValueError(f"a must be >= 0, got {a}")
    if mu == 0:
        return 0.0 if a > 0 else 1.0
    r = a / mu
    return math.exp(mu * r * r / (math.sqrt(1 + r * r) + 1) - a * math.asinh(r))


@dataclass(frozen=True)
class RingBits:
    """The ring Z_{2^k} of one aggregation, and why (:func:`modulus_bits`).

    Attributes:
        k_bits: k; a sum u with |u| <= signal_bound + noise_bound is recovered exactly.
        d_pad: d', the number of coordinates sent.
        bits_per_coordinate: k * d' / d, bits on the wire per model coordinate (Kairouz et al. report k).
        signal_bound: S, bound on |coordinate| of the sum of the rounded vectors (integer units).
        noise_bound: N = sigmas * sqrt(n * mu), headroom for the summed noise.
        wrap_probability: union bound on P(some coordinate of the sum wraps).
    """

    k_bits: int
    d_pad: int
    bits_per_coordinate: float
    signal_bound: float
    noise_bound: float
    wrap_probability: float


def modulus_bits(n_clients: int, clip: float, gamma: float, mu: float, d: int, sigmas: float = 8.0,
                 beta: float = BETA, rotated: bool = True) -> RingBits:
    """The smallest k such that the sum of all clients' encoded vectors wraps in Z_{2^k} only with small chance.

    Each coordinate j of the sum is u_j = s_j + z_j, s_j the sum of the n rounded vectors, z_j the summed noise
    (Skellam of variance n * mu at most: fewer survivors carry less). The ring holds every |u| <= B =
    floor(S + N) when 2^(k-1) > B, i.e. k = bit_length(B) + 1; then

        P(wrap) <= d' * ( P(|s_j| > S) + P(|z_j| > N) ),  P(|z_j| > N) <= 2 skellam_tail(N, n mu),
        N = sigmas * sqrt(n mu).

    S, worst case (``rotated=False``, or when it is smaller): |s_j| <= sum_i ||x~_i||_2 <= n Delta_2
    (:func:`l2_bound`), for any inputs, P(|s_j| > S) = 0. S with the rotation (Kairouz et al., Sec. 4 and 5):
    s_j = (H D sum_i x'_i)_j + r_j with |r_j| < n (rounding) and ||sum_i x'_i|| <= n c / gamma, so by Hoeffding
    over the public random signs P(|(H D v)_j| > t) <= 2 exp(-t^2 d' / (2 ||v||^2)); with
    S = sigmas * n (c/gamma) / sqrt(d') + n, P(|s_j| > S) <= 2 exp(-sigmas^2 / 2). This needs inputs chosen
    independently of the (public) rotation seed; a malicious client can wrap the sum anyway (it may send any
    ring element), which costs utility, not privacy.

    Args:
        n_clients: clients in the aggregation (the most that can survive).
        clip, gamma: clip norm (model units) and step.
        mu: each client's noise variance (:func:`share_variance`), integer units.
        d: the model's dimension (before padding).
        sigmas: headroom in standard deviations for the noise and the rotated signal.
        beta: the rounding parameter (it sets Delta_2).
        rotated: use the rotation bound when it is smaller than the worst case.

    Raises:
        ValueError: bad parameters, or k > 62 (raise gamma or lower clip).
    """
    if n_clients < 1 or not sigmas > 0 or mu < 0:
        raise ValueError(f"need n_clients >= 1, sigmas > 0, mu >= 0, got {n_clients}, {sigmas}, {mu}")
    d_pad = padded_dim(d)
    signal, p_signal = n_clients * l2_bound(clip, gamma, d_pad, beta), 0.0
    rotation = sigmas * n_clients * (clip / gamma) / math.sqrt(d_pad) + n_clients
    if rotated and rotation < signal:
        signal, p_signal = rotation, min(1.0, 2 * math.exp(-sigmas * sigmas / 2))
    noise = sigmas * math.sqrt(n_clients * mu)
    p_noise = 2 * skellam_tail(noise, n_clients * mu) if mu > 0 else 0.0
    k = int(math.floor(signal + noise)).bit_length() + 1
    if k > MAX_K_BITS:
        raise ValueError(f"the sum needs k = {k} bits > {MAX_K_BITS}: raise gamma or lower clip")
    return RingBits(k, d_pad, k * d_pad / d, signal, noise, min(1.0, d_pad * (p_signal + p_noise)))


class Encoded(NamedTuple):
    """A client's output: ring words, whether x was clipped, rounding tries."""

    words: np.ndarray  # uint64, shape (d',), residues mod 2^k
    clipped: bool
    tries: int


def encode(x, *, clip: float, gamma: float, seed, k_bits: int, mu: float, rng: np.random.Generator,
           beta: float = BETA, max_tries: int = 100, secure: bool = False) -> Encoded:
    """The client pipeline: clip, rotate (public ``seed``), scale and round, add Skellam(mu), mod 2^k.

    ``rng`` (secret, :func:`noise_rng`) drives the rounding, and the noise unless ``secure`` (then each call
    draws its noise from a fresh generator). The words go to secure aggregation; the server decodes the sum
    with :func:`decode`. Shapes: x (d,) float -> words (d',) uint64. Raises what the steps raise, and
    ValueError for k_bits outside [1, 62].
    """
    if not 1 <= k_bits <= MAX_K_BITS:
        raise ValueError(f"k_bits must be in [1, {MAX_K_BITS}], got {k_bits}")
    clipped, was_clipped = clip_l2(x, clip)
    rounded, tries = scale_and_round(rotate(clipped, seed), gamma, beta, rng, max_tries, clip=clip)
    noise = skellam_noise(mu, rounded.size, None if secure else rng, secure=secure)
    words = np.mod(rounded + noise, np.int64(1) << k_bits).astype(np.uint64)
    return Encoded(words, was_clipped, tries)


def decode(sum_int, gamma: float, seed, d: int, k_bits: int) -> np.ndarray:
    """The server's side after unmasking: the survivors' sum mod 2^k -> float sum of their clipped vectors.

    Centres each residue into [-2^(k-1), 2^(k-1)), multiplies by gamma, unrotates with the public ``seed``
    and cuts to the first d coordinates. The result is sum_i clip(x_i) + rotated-back rounding error (L2 <=
    gamma sqrt(d') per client) + noise of variance gamma^2 * carried_variance per coordinate; divide by the
    number of survivors (or the weight sum) for a mean. The server learns this noised sum and nothing else.

    Args:
        sum_int: integers, shape (d',): uint64 residues (or any integers, reduced mod 2^k here).
        gamma: the clients' step. seed: the rotation seed. d: the model dimension. k_bits: the ring.

    Returns:
        float64, shape (d,).

    Raises:
        ValueError: k_bits outside [1, 62], d' not a power of two, d > d'.
    """
    if not 1 <= k_bits <= MAX_K_BITS:
        raise ValueError(f"k_bits must be in [1, {MAX_K_BITS}], got {k_bits}")
    a = np.asarray(sum_int)
    if a.dtype.kind == "u":
        a = (a & np.uint64((1 << k_bits) - 1)).astype(np.int64)
    else:
        a = np.mod(a.astype(np.int64), np.int64(1) << k_bits)
    half = np.int64(1) << (k_bits - 1)
    centred = np.where(a >= half, a - 2 * half, a)
    return unrotate(centred.astype(np.float64) * _positive(gamma, "gamma"), seed, d)
