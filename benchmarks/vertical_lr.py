"""Seconds per epoch of vertical logistic regression with Paillier, next to the identical protocol with
encryption replaced by identity (``backend="identity"``), measured in the same run.

Parties run as threads over the in-process transport (protobuf serialisation included, no sockets), so
the figures are the protocol's compute + serialisation cost on this machine. Datasets:

* breast cancer (sklearn, 569 rows; guest 15 features + labels, host 15 features), standardised,
  ``--breast-epochs`` epochs (default 3);
* synthetic: ``--rows`` rows (default 100,000) x (10 guest + 10 host) features, ``--epochs`` (default 1).

``--he-scheme`` (default: ``paillier ou``) trains once per scheme (Paillier, Okamoto-Uchiyama; 2048-bit
modulus, ~112-bit security, unless ``--key-bits``). For each, the seconds per epoch are printed next to
the *limit*: the homomorphic operations the run performed (counted by a wrapper around the backend:
encryptions of host scores / residuals, ``X^T [[d]]`` entries, masks, masked decryptions; see
``_heops.py``), priced at the engine's own rates measured in the same process with the same worker pool (just before
and just after the training, the better of the two: a shared machine's load changes within a run).
measured / limit says how close the protocol code runs to the engine; the protocol's formula minimum
(without the encrypted loss) is printed beside it.

The Paillier worker pool (``SECUREFLHV_WORKERS``, default: all cores) is started before timing.

Batch size: ``--batch-size`` (default: full batch, i.e. one batch per epoch).

Examples::

    python benchmarks/vertical_lr.py --quick           # 1024-bit key, 2,000 synthetic rows
    python benchmarks/vertical_lr.py                   # 2048-bit key, breast cancer + 100k rows, 1 epoch
    python benchmarks/vertical_lr.py --batch-size 4096 --mode two_party
"""
from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from secureflhv.crypto.homomorphic import paillier  # noqa: E402
from secureflhv.crypto.homomorphic.backend import make_backend  # noqa: E402
from secureflhv.transport import InProcessNetwork  # noqa: E402
from secureflhv.vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _heops  # noqa: E402
import _report  # noqa: E402
import _wire  # noqa: E402


def train(Xg, y, Xh, cfg: VerticalLRConfig, backend) -> dict:
    """One federated training (guest, one host, arbiter if any) in threads, all sharing ``backend`` (a name
    or an HEBackend instance); returns timings."""
    arbiter = "server" if cfg.mode == "arbiter" else None
    parties = ["guest", "host-1"] + ([arbiter] if arbiter else [])
    net = InProcessNetwork("bench", parties, deadline=3600)

    roles = [VerticalLRGuest(net.transport("guest"), ["host-1"], Xg, y, cfg, arbiter, backend=backend),
             VerticalLRHost(net.transport("host-1"), "guest", ["host-1"], Xh, cfg, arbiter, backend=backend)]
    if arbiter:
        roles.append(VerticalLRArbiter(net.transport(arbiter), "guest", ["host-1"], cfg, backend=backend))
    out, errors = {}, {}

    def run(role):
        try:
            out[role.party_id] = role.fit()
        except Exception as exc:  # noqa: BLE001
            errors[role.party_id] = exc

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(r,)) for r in roles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"training failed: {errors}")
    g = out["guest"]
    return {"sec_per_epoch": float(np.mean(g.epoch_seconds)), "epochs": g.epochs, "total": total,
            "loss": g.losses[-1], "bytes": net.sent_bytes,
            "wire": net.wire_stats(),  # per party, per peer and tag: see print_bytes
            "weights": np.concatenate([g.weights, out["host-1"].weights, [g.intercept]])}


def engine_rates(scheme: str, key_bits: int, cfg=None, dot_rows: int = 8192, dot_cols: int = 4) -> dict:
    """Wall-clock rates of the operations an epoch cannot avoid, with the worker pool training uses.

    Returns {"encrypt": values/s (public key), "dot": X entries/s of X^T [[d]], "decrypt": values/s
    (masked decryption at the key holder)}. ``cfg``: the job's config, for its fixed-point precisions.
    ``dot_rows``: rows of the timed X^T [[d]] (the job's row count): its multi-exponentiation costs less per
    entry over more rows, so a short one would overstate the limit. The 8,192 ciphertexts' values are
    repeated to that length (the cost does not depend on them) as distinct objects, as in an epoch.
    ``dot_cols``: X's columns (the job's host columns: sending the ciphertexts to the workers is shared
    by every column, so fewer columns cost more per entry).
    """
    he = make_backend(scheme) if cfg is None else make_backend(scheme, cfg.precision_bits, cfg.dot_precision_bits)
    pub, priv = he.generate_keypair(key_bits, key_bits < 2048)
    rng = np.random.default_rng(1)
    x = rng.normal(size=8192)
    he.encrypt(pub, x[:2048])  # tables and worker start-up outside the timed region
    t0 = time.perf_counter()
    enc = he.encrypt(pub, x)
    r_enc = len(x) / (time.perf_counter() - t0)
    rows = max(int(dot_rows), len(x))
    X = rng.normal(size=(rows, max(1, int(dot_cols))))
    cts = enc.ciphertexts[np.arange(rows) % len(x)]
    enc_rows = paillier.EncryptedArray(pub, np.fromiter((type(c)(int(c)) for c in cts), dtype=object, count=rows),
                                       enc.exponent)
    t0 = time.perf_counter()
    he.dot(X, enc_rows)
    r_dot = X.size / (time.perf_counter() - t0)
    masked, _ = he.mask(pub, enc[:512])
    t0 = time.perf_counter()
    he.decrypt_masked(priv, masked)
    r_dec = 512 / (time.perf_counter() - t0)
    return {"encrypt": r_enc, "dot": r_dot, "decrypt": r_dec}


def limit_seconds(rates: dict, n: int, d_guest: int, d_host: int, mode: str, fit_intercept: bool = True) -> float:
    """Seconds per full-batch epoch of the unavoidable operations at ``rates`` (one host).

    arbiter: the host encrypts u_h (n values); X^T [[d]] at the guest (d_guest + intercept columns) and
    the host; the arbiter decrypts both gradients and the loss. two_party: the guest encrypts [[d]] (n),
    the host computes X_h^T [[d]], the guest decrypts the host's gradient.
    """
    dg = d_guest + int(fit_intercept)
    if mode == "arbiter":
        return n / rates["encrypt"] + n * (dg + d_host) / rates["dot"] + (dg + d_host + 1) / rates["decrypt"]
    return n / rates["encrypt"] + n * d_host / rates["dot"] + d_host / rates["decrypt"]


def datasets(args):
    rng = np.random.default_rng(0)
    if not args.skip_breast:
        from sklearn.datasets import load_breast_cancer
        X, y = load_breast_cancer(return_X_y=True)
        X = (X - X.mean(0)) / X.std(0)
        yield "breast cancer (569 x 15+15)", X[:, :15], y, X[:, 15:], args.breast_epochs
    if args.skip_synthetic:
        return
    n = args.rows
    X = rng.normal(size=(n, 20))
    y = (X @ rng.normal(size=20) + rng.normal(size=n) > 0).astype(int)
    yield f"synthetic ({n:,} x 10+10)", X[:, :10], y, X[:, 10:], args.epochs


def run_scheme(name, Xg, y, Xh, epochs, cfg, scheme: str, ident: dict, args) -> dict:
    """Train with ``scheme``; print seconds per epoch beside identity's and beside the limit: the
    homomorphic operations this run performed (counted) priced at the engine's rates measured now.
    Returns the run's figures (see :func:`train`) plus ``limit`` (s/epoch), ``rates`` and ``ops``."""
    he = _heops.counting_backend(scheme, cfg.precision_bits, cfg.dot_precision_bits)
    # rates just before and just after training, the better of the two, so that a burst of load from other
    # jobs does not lower the limit; X^T [[d]] timed over this dataset's rows and host columns
    before = engine_rates(scheme, args.key_bits, cfg, len(y), Xh.shape[1])
    enc = train(Xg, y, Xh, cfg, he)
    after = engine_rates(scheme, args.key_bits, cfg, len(y), Xh.shape[1])
    rates = {k: max(before[k], after[k]) for k in before}
    # same protocol, same maths: the two runs must agree (fixed-point rounding only)
    drift = float(np.max(np.abs(enc["weights"] - ident["weights"])))
    label = f"{name} [{scheme}]"
    print(f"{label:30} {epochs:6d} {enc['sec_per_epoch']:17.3f} {ident['sec_per_epoch']:17.4f} "
          f"{enc['sec_per_epoch'] / ident['sec_per_epoch']:8.0f}x {enc['bytes'] / 1e6:12.1f}"
          f"   (max |w_{scheme} - w_identity| = {drift:.1e})", flush=True)
    if drift > 1e-6:
        print(f"WARNING: {scheme} and identity weights differ by {drift:.2e}", file=sys.stderr)
    limit, ops = _heops.priced(he.counts, rates, enc["epochs"])
    print(f"{'':30} limit {limit:.3f} s/epoch = ops counted in this run, per epoch: {ops}; at the engine's "
          f"rates measured before and after training (best), same pool (encrypt {rates['encrypt']:,.0f}/s, X^T[[d]] "
          f"{rates['dot']:,.0f} entries/s, masked decrypt {rates['decrypt']:,.0f}/s)", flush=True)
    print(f"{'':30} measured / limit = {enc['sec_per_epoch'] / limit:.2f} (1.00 = protocol code adds nothing "
          f"to the engine)", flush=True)
    if args.batch_size is None or args.batch_size >= len(y):
        floor = limit_seconds(rates, len(y), Xg.shape[1], Xh.shape[1], args.mode)
        print(f"{'':30} (the protocol's minimum, by formula: {floor:.3f} s/epoch; the rest of the count is the "
              f"encrypted loss)", flush=True)
    enc.update(limit=limit, rates=rates, ops=ops)
    return enc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__[__doc__.index("Examples"):])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1024-bit key, 2,000 synthetic rows, 1 epoch")
    ap.add_argument("--key-bits", type=int, default=2048, help="Paillier modulus bits (default 2048)")
    ap.add_argument("--rows", type=int, default=100_000, help="synthetic rows (default 100,000)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs per run (default 1)")
    ap.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: full batch)")
    ap.add_argument("--mode", choices=["arbiter", "two_party"], default="arbiter")
    ap.add_argument("--breast-epochs", type=int, default=3, help="epochs for breast cancer (default 3)")
    ap.add_argument("--skip-breast", action="store_true", help="only the synthetic dataset")
    ap.add_argument("--skip-synthetic", action="store_true", help="only breast cancer")
    ap.add_argument("--he-scheme", nargs="+", choices=["paillier", "ou"], default=["paillier", "ou"],
                    help="homomorphic scheme(s) to train with, each next to its limit (default: paillier ou)")
    args = ap.parse_args(argv)
    if args.quick:
        args.key_bits, args.rows, args.epochs = min(args.key_bits, 1024), min(args.rows, 2000), 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.quick:
        args.breast_epochs = 1
    print(f"vertical LR, mode={args.mode}, {args.key_bits}-bit keys (modulus n, every scheme), schemes "
          f"{', '.join(args.he_scheme)}, "
          f"batch={args.batch_size or 'full'}, "
          f"Paillier workers={paillier.get_workers()}")
    # start the Paillier worker pool outside the timed region (its start-up is a one-off per process),
    # with a key of the run's size (no warning about a small key the figures do not use)
    pub, _ = paillier.generate_keypair(args.key_bits, insecure_test_key=args.key_bits < 2048)
    paillier.encrypt(pub, np.zeros(4 * paillier.PAR_ENCRYPT_MIN))
    print(f"{'dataset':30} {'epochs':>6} {'encrypted s/epoch':>17} {'identity s/epoch':>17} {'ratio':>8} "
          f"{'MB sent':>12}")
    done = []
    for name, Xg, y, Xh, epochs in datasets(args):
        cfg = VerticalLRConfig(mode=args.mode, epochs=epochs, batch_size=args.batch_size, learning_rate=0.15,
                               l2=1e-3, early_stopping=False, key_bits=args.key_bits,
                               insecure_test_key=args.key_bits < 2048)
        ident = train(Xg, y, Xh, cfg, "identity")
        for scheme in args.he_scheme:
            enc = run_scheme(name, Xg, y, Xh, epochs, cfg, scheme, ident, args)
            print_bytes(enc, epochs, scheme)
            done.append((scheme, name, enc, ident))
    if not args.quick and done:
        record_rows(args, done)
    return 0


def print_bytes(enc: dict, epochs: int, scheme: str) -> None:
    """Bytes each party sent / received per epoch (payload + framing, as over gRPC with TLS)."""
    print(f"{'':30} bytes per epoch ({scheme}): {_wire.line(enc['wire'], 1 / epochs)}", flush=True)


def record_rows(args, done) -> None:
    """Rows ``vertical_lr`` (Paillier) and ``vertical_lr_ou`` of docs/benchmarks.json (default settings
    only: arbiter mode, full batch), each scheme beside identity and beside its limit."""
    if args.mode != "arbiter" or args.batch_size is not None:
        print("not recorded in docs/benchmarks.json: only the default arbiter mode, full batch, is")
        return
    for scheme in args.he_scheme:
        runs = [(n, e, i, 1 / e["epochs"]) for s, n, e, i in done if s == scheme]
        title = {"paillier": "Paillier", "ou": "Okamoto-Uchiyama"}[scheme]
        _report.record("vertical_lr" if scheme == "paillier" else f"vertical_lr_{scheme}", {
            "what": f"vertical LR, {title} {args.key_bits}-bit, full batch (`vertical_lr.py --he-scheme {scheme}`)",
            "ours": "; ".join(f"{n}: {e['sec_per_epoch']:.2f} s/epoch (limit {e['limit']:.2f} s: "
                              f"{e['ops']})" for n, e, _, _ in runs),
            "baseline": "encryption replaced by identity: " + "; ".join(f"{i['sec_per_epoch']:.4f} s"
                                                                          for _, _, i, _ in runs),
            "ratio": "; ".join(f"{e['sec_per_epoch'] / i['sec_per_epoch']:,.0f}× identity, "
                               f"{e['sec_per_epoch'] / e['limit']:.2f}× the limit" for _, e, i, _ in runs),
            "bytes": "; ".join(f"{n}: {_wire.cell(e['wire'], s, 'epoch')}" for n, e, _, s in runs)})


if __name__ == "__main__":
    sys.exit(main())
