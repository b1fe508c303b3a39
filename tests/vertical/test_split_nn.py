"""Split NN: equivalence with an independent centralised torch twin (:mod:`snn_twin`), noise cancellation,
multi-host, checkpoints."""
import numpy as np
import pytest

from secureflhv.vertical.split_nn import SplitNNConfig, load_checkpoint
from snn_harness import make_roles, run_roles, toy
from snn_twin import roles_state, seeded_twin

KEY = {"key_bits": 512, "insecure_test_key": True}
SMALL = dict(KEY, host_bottom=[5, 3], guest_bottom=[4], interactive_units=3, top_hidden=[4])


@pytest.mark.parametrize("optimizer,classes,n_hosts", [("sgd", 2, 1), ("adam", 3, 2)])
def test_training_steps_equal_centralised_torch(optimizer, classes, n_hosts, tmp_path):
    X, y = toy(n=24, d=7, seed=1, classes=classes)
    cols = np.array_split(np.arange(7), n_hosts + 1)
    Xg, Xhs = X[:, cols[0]], [X[:, c] for c in cols[1:]]
    cfg = SplitNNConfig(**SMALL, epochs=1, batch_size=12, optimizer=optimizer, learning_rate=0.05,
                        interactive_lr=0.2, weight_noise=3.0, seed=5, init_seed=2)
    net, guest, hosts = make_roles(Xg, y, Xhs, cfg, guest_kwargs={"checkpoint_dir": tmp_path},
                                   host_kwargs={"checkpoint_dir": tmp_path})
    twin = seeded_twin(cfg, guest, hosts, Xg, Xhs, y)
    assert all(np.all(h.E == 0) for h in hosts)
    results, errors = run_roles(guest, hosts, predict_sets=(Xg, Xhs))
    assert not errors, errors
    ref_losses = twin.fit(Xg, Xhs, y)
    assert len(results["guest"].batch_losses) == 2
    # two steps: the fixed-point encoding (2**-32 steps) has had no room to grow
    np.testing.assert_allclose(results["guest"].batch_losses, ref_losses, rtol=1e-8, atol=1e-10)
    fed, ref = roles_state(guest, hosts), twin.state()
    for k in ref:
        np.testing.assert_allclose(fed[k], ref[k], rtol=1e-7, atol=1e-8, err_msg=k)
    # the noise shares are real: neither side alone holds the interactive weights
    for i, h in enumerate(hosts):
        assert np.max(np.abs(h.E)) > 0.5
        assert np.max(np.abs(guest.V[h.party_id] - ref[f"W_h.{i}"])) > 0.5
    # federated prediction = the twin's forward pass
    np.testing.assert_allclose(results["proba"], twin.predict(Xg, Xhs), rtol=1e-7, atol=1e-9)
    # checkpoints per epoch (npz, no pickle) restore the same model
    g_ckpt = load_checkpoint(results["guest"].checkpoints[-1])
    np.testing.assert_array_equal(g_ckpt["interactive.W_g"], guest.W_g)
    h_ckpt = load_checkpoint(results["host-1"].checkpoints[-1])
    np.testing.assert_array_equal(h_ckpt["interactive.E"], hosts[0].E)
    _, guest2, hosts2 = make_roles(Xg, y, Xhs, cfg.model_copy(update={"init_seed": 9}))
    guest2.load_state(g_ckpt)
    hosts2[0].load_state(h_ckpt)
    for k in ("interactive.bias", "top.0.weight"):
        np.testing.assert_array_equal(guest2.state_arrays()[k], guest.state_arrays()[k])
    np.testing.assert_array_equal(hosts2[0].state_arrays()["bottom.0.weight"], hosts[0].state_arrays()["bottom.0.weight"])


def test_host_only_decrypts_uniformly_masked_interactive_values():
    """The forward product [[A V]] and the weight gradient [[A^T delta]] reach the host (key holder) only
    as (m + r) mod n with r uniform in Z_n: the decrypted residues are spread over Z_n, never the small
    fixed-point mantissas (|m| << n) they hide."""
    from secureflhv.crypto.homomorphic.backend import PaillierHE

    seen, ns = [], []
    orig = PaillierHE.decrypt_masked

    def spy(self, priv, enc, add=None):
        out = orig(self, priv, enc, add)
        seen.extend(out.values)
        ns.append(priv.public_key.n)
        return out

    X, y = toy(n=20, d=5, seed=2)
    cfg = SplitNNConfig(**SMALL, epochs=1, batch_size=10)
    PaillierHE.decrypt_masked = spy
    try:
        _, guest, hosts = make_roles(X[:, :2], y, [X[:, 2:]], cfg)
        results, errors = run_roles(guest, hosts)
    finally:
        PaillierHE.decrypt_masked = orig
    assert not errors, errors
    n = ns[0]
    assert len(seen) == 2 * (10 * 3 + 3 * 3)  # per batch: forward (b, o) and gradient (k, o)
    small = sum(1 for v in seen if v < n >> 64 or v > n - (n >> 64))
    assert small == 0
    top_bits = [v * 8 // n for v in seen]  # uniform residues fill all eighths of Z_n
    assert len(set(top_bits)) == 8


def test_okamoto_uchiyama_steps_equal_centralised_torch():
    """he_scheme: ou (host keys are OU, masks statistical) gives the same training path as Paillier does."""
    pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    X, y = toy(n=20, d=6, seed=4, classes=2)
    Xg, Xhs = X[:, :2], [X[:, 2:4], X[:, 4:]]
    cfg = SplitNNConfig(**dict(SMALL, key_bits=1024, he_scheme="ou"), epochs=1, batch_size=10, optimizer="sgd",
                        learning_rate=0.05, interactive_lr=0.2, weight_noise=3.0, seed=6, init_seed=1)
    net, guest, hosts = make_roles(Xg, y, Xhs, cfg)
    assert guest.he.name == "ou" and all(h.he.name == "ou" for h in hosts)
    twin = seeded_twin(cfg, guest, hosts, Xg, Xhs, y)
    results, errors = run_roles(guest, hosts)
    assert not errors, errors
    np.testing.assert_allclose(results["guest"].batch_losses, twin.fit(Xg, Xhs, y), rtol=1e-8, atol=1e-10)
    fed, ref = roles_state(guest, hosts), twin.state()
    for k in ref:
        np.testing.assert_allclose(fed[k], ref[k], rtol=1e-7, atol=1e-8, err_msg=k)
