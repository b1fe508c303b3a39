"""What the server sees: its whole transcript of a secagg round holds no client's plaintext update
(the same check fails for plain_quantised, so it can detect a leak)."""
import numpy as np

from secureflhv.crypto.quantise import quantise, rounding_rng
from secureflhv.secagg.bonawitz import TAG_MASKED
from secureflhv.proto import secagg_pb2

from secagg_harness import config, make_inputs, run_round

N, D = 5, 4000


def leaks(cfg, kind):
    ids, xs, ws = make_inputs(N, D, seed=9)
    cfg = config(kind=kind)
    res, errors, clients, st, net = run_round(cfg, ids, xs, ws)
    assert not errors and not isinstance(res, Exception)
    qp = cfg.quant_params(N, D)
    transcript = b"".join(p for _, _, p in st.received)
    found = []
    for c in ids:
        words = quantise(xs[c], ws[c], qp, rounding_rng(cfg.seed, 1, c))[0].astype(qp.word_dtype)
        chunk = words[:64].tobytes()  # 64 consecutive quantised coordinates
        if chunk in transcript or (ws[c] * xs[c][:64]).tobytes() in transcript:
            found.append(c)
    return found, st, ids, xs, ws, qp


def test_secagg_transcript_holds_no_plaintext_update():
    found, st, ids, xs, ws, qp = leaks(config(), "secagg")
    assert found == []
    masked = [secagg_pb2.MaskedInput.FromString(p) for _, tag, p in st.received if tag == TAG_MASKED]
    assert len(masked) == N
    for m in masked:
        y = np.frombuffer(m.y.data, dtype=m.y.dtype).astype(np.float64) / 2.0 ** qp.k_bits
        # uniform on [0, 1): mean 1/2, variance 1/12, deciles evenly filled
        assert abs(y.mean() - 0.5) < 0.03 and abs(y.var() - 1 / 12) < 0.01
        hist = np.histogram(y, bins=10, range=(0, 1))[0]
        assert hist.min() > 0.8 * D / 10
        for c in ids:  # no correlation with any client's update
            assert abs(np.corrcoef(y[:D], xs[c])[0, 1]) < 0.1


def test_plain_quantised_transcript_does_show_updates():
    found, *_ = leaks(config(), "plain_quantised")
    assert len(found) == N  # the detector works: without masks every update is visible
