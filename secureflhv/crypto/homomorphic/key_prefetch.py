"""Key pairs generated in the background while a party prepares its data (PSI, loading, splitting).

The key holder of a vertical job (the guest in SecureBoost and in two-party LR, the arbiter in
arbiter-mode LR, each host in split NN) needs its homomorphic key pair only when training starts.
Generating it costs little with Paillier (~0.05 s at 2048 bits) but 0.3-5 s with OU at 2048 bits (HEU's
key search, :mod:`secureflhv.crypto.homomorphic.ou`) and several seconds at 3072 bits; started with the job, it
overlaps the data preparation instead of delaying the first epoch or tree. The roles take the Future
as their ``keypair`` and resolve it where they would otherwise generate the key
(:func:`resolve_keypair`), so a key that is ready costs nothing and one that is not is waited for.
OU key generation runs in child processes, so this thread holds no lock the preparation needs.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future

from .backend import make_backend


def prefetch_keypair(scheme: str, key_bits: int, insecure_test_key: bool = False) -> Future:
    """Start generating a (public, private) key pair of ``scheme`` ("paillier" or "ou") of ``key_bits``
    bits in a daemon thread; returns its Future. ``result()`` raises what key generation raised (e.g.
    ValueError for a key below the secure size without ``insecure_test_key``). Raises ValueError at
    once for an unknown scheme."""
    he = make_backend(scheme)
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def generate() -> None:
        try:
            fut.set_result(he.generate_keypair(int(key_bits), bool(insecure_test_key)))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever resolves the Future
            fut.set_exception(exc)

    threading.Thread(target=generate, name="secureflhv-keygen", daemon=True).start()
    return fut


def resolve_keypair(keypair):
    """A role's ``keypair`` argument as (public, private): a Future (:func:`prefetch_keypair`) is waited
    for; a tuple and None (generate it now) pass unchanged."""
    return keypair.result() if isinstance(keypair, Future) else keypair
