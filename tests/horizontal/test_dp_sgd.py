"""Record-level DP-SGD at a horizontal FL client with Opacus (issue 38, local placement): ε equals the
accountants computed here, one round equals a plain-torch twin of per-example-clipped SGD on the sampled batches,
clipping bounds every step, unsupported models are refused, target_epsilon calibration, and the client's state
across rounds (accountant, hooks removed, plain parameter names)."""
from __future__ import annotations

import copy
import math

import numpy as np
import pydantic
import pytest
import torch
from torch import nn

from secureflhv.horizontal.dp_sgd import RecordDP, record_epsilon
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat
from secureflhv.horizontal.strategies import FedAvg, LocalTrainConfig, make_strategy
from secureflhv.horizontal.user_loop import UserLoop
from secureflhv.params.record_privacy import RecordDPParams

MODEL = ModelSpec(name="mlp", n_features=5, n_classes=3, hidden=(8,))


def _data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 3, n)


def _record_forwards(model: nn.Module) -> tuple[list, object]:
    """(log, handle): every forward's input and the parameters it started from (a copy), in order."""
    log = []

    def hook(_module, args):
        log.append((args[0].detach().clone(), [p.detach().clone() for p in model.parameters()]))
    return log, model.register_forward_pre_hook(hook)


def _indices(X: np.ndarray, batch: torch.Tensor) -> list[int]:
    rows = {X[i].tobytes(): i for i in range(len(X))}
    return [rows[r.numpy().tobytes()] for r in batch]


def _opacus_free(model: nn.Module) -> None:
    """No Opacus hook or attribute is left on the plain module; its parameter names are the plain ones."""
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in build_model(MODEL, seed=0).named_parameters()]
    for m in model.modules():
        assert not m._forward_hooks and not m._backward_hooks and not m._forward_pre_hooks, m
        assert not hasattr(m, "autograd_grad_sample_hooks") and not hasattr(m, "activations")
    for p in model.parameters():
        for attr in ("grad_sample", "summed_grad", "_forward_counter", "_current_grad_sample"):
            assert not hasattr(p, attr), attr


# ------------------------------------------------------------------------------------------ (1) accounting
def test_epsilon_equals_opacus_and_dp_accounting_computed_here():
    """record_epsilon equals Opacus's RDPAccountant stepped one step at a time (default orders) and dp-accounting's
    RdpAccountant composing PoissonSampled(q, Gaussian(z)) `steps` times at the same integer orders, to 1e-6.

    At Opacus's default *fractional* orders the two libraries' sampled-Gaussian RDP differ (dp-accounting sums
    |binomial| terms, Opacus the signed series: ~1e-5 relative in RDP), so there dp-accounting's ε is the larger by
    less than 1e-3 relative; the PRV accountant agrees with dp-accounting's PLD to 1%."""
    import dp_accounting
    from dp_accounting import pld as dp_pld
    from dp_accounting import rdp as dp_rdp
    from opacus.accountants import RDPAccountant

    for z, q, steps, delta in [(1.1, 0.05, 300, 1e-5), (0.8, 0.01, 1000, 1e-6), (2.5, 0.2, 40, 1e-5)]:
        acc = RDPAccountant()
        for _ in range(steps):
            acc.step(noise_multiplier=z, sample_rate=q)
        assert record_epsilon(z, q, steps, delta) == pytest.approx(acc.get_epsilon(delta=delta), abs=1e-6)

        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        ints = list(range(2, 257))
        ref = dp_rdp.RdpAccountant(orders=ints)
        ref.compose(event, steps)
        assert record_epsilon(z, q, steps, delta, alphas=ints) == pytest.approx(ref.get_epsilon(delta), abs=1e-6)

        frac = dp_rdp.RdpAccountant(orders=RDPAccountant.DEFAULT_ALPHAS)
        frac.compose(event, steps)
        mine = record_epsilon(z, q, steps, delta)
        assert mine <= frac.get_epsilon(delta) + 1e-9 and frac.get_epsilon(delta) == pytest.approx(mine, rel=1e-3)
    pld = dp_pld.PLDAccountant()
    pld.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1)), 300)
    assert record_epsilon(1.1, 0.05, 300, 1e-5, accountant="prv") == pytest.approx(pld.get_epsilon(1e-5), rel=1e-2)
    assert record_epsilon(1.1, 0.05, 0, 1e-5) == 0.0


# ------------------------------------------------------------------------------------------ (2) the twin
def _twin_round(model0: nn.Module, X, y, batches, *, lr, momentum, wd, C, B, mu=0.0, correction=None):
    """Plain torch DP-SGD without noise: per-example gradients by a loop over examples, each scaled to norm at most
    C, summed, divided by the expected batch size B; FedProx's mu (w - w0) and weight decay added; SGD momentum
    (torch's rule, dampening 0); SCAFFOLD's w -= lr * correction after each step."""
    twin = copy.deepcopy(model0)
    params = list(twin.parameters())
    start = [p.detach().clone() for p in params]
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    bufs = None
    for idx in batches:
        total = [torch.zeros_like(p) for p in params]
        for i in idx:
            loss = nn.functional.cross_entropy(twin(Xt[i:i + 1]), yt[i:i + 1])
            grads = torch.autograd.grad(loss, params)
            norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
            for t, g in zip(total, grads):
                t += g * min(1.0, C / norm)
        with torch.no_grad():
            d = [t / B + mu * (p - s) + wd * p for t, p, s in zip(total, params, start)]
            bufs = d if bufs is None else [momentum * b + g for b, g in zip(bufs, d)]
            for p, b in zip(params, bufs):
                p -= lr * b
            if correction is not None:
                for p, c in zip(params, correction):
                    p -= lr * c
    return twin


@pytest.mark.parametrize("strategy,clip", [("fedavg", 1e6), ("fedavg", 0.05), ("fedprox", 0.05), ("scaffold", 0.05)])
def test_one_round_equals_a_plain_torch_twin_on_the_sampled_batches(strategy, clip):
    """z tiny (noise std z·C = 1e-9), C huge (no clipping) or small (every example clipped): the client's new
    weights equal the twin's on the batches Opacus's Poisson loader drew (read from the model's inputs), to 1e-5."""
    X, y = _data(40)
    cfg = LocalTrainConfig(epochs=2, batch_size=6, lr=0.1, momentum=0.5, weight_decay=1e-3,
                           dp_sgd=RecordDPParams(clip_norm=clip, noise_multiplier=1e-9 / clip, noise_seed=3))
    model = build_model(MODEL, seed=1)
    model0 = copy.deepcopy(model)
    s = make_strategy(strategy, mu=0.1)
    control = np.random.default_rng(5).normal(scale=0.1, size=get_flat(model).size).astype(np.float32)
    log, handle = _record_forwards(model)
    upd = s.client_update(model, get_flat(model), X, y, cfg, np.random.default_rng(0),
                          {"control": control} if strategy == "scaffold" else None)
    handle.remove()
    batches = [_indices(X, xb) for xb, _ in log]
    assert upd.steps == len(batches) == 2 * int(40 / 6) and math.isnan(upd.loss)
    assert 0 < sum(map(len, batches)) < 2 * 40 * 2  # Poisson batches: sizes vary around 6
    corr, off = None, 0
    if strategy == "scaffold":
        corr = []
        for p in model0.parameters():
            corr.append(torch.from_numpy(control[off:off + p.numel()]).reshape(p.shape))
            off += p.numel()
    twin = _twin_round(model0, X, y, batches, lr=0.1, momentum=0.5, wd=1e-3, C=clip, B=6,
                       mu=0.1 if strategy == "fedprox" else 0.0, correction=corr)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)
    _opacus_free(model)


def test_batches_come_from_the_clients_entropy_not_the_job_seed():
    """Without noise_seed two clients with the same job generator train differently; with it, a different job
    generator changes nothing (the sampling does not read it)."""
    X, y = _data(40)
    start = get_flat(build_model(MODEL, seed=1))

    def run(params, rng_seed):
        model = build_model(MODEL, seed=1)
        FedAvg().client_update(model, start, X, y, LocalTrainConfig(batch_size=8, lr=0.1, dp_sgd=params),
                               np.random.default_rng(rng_seed))
        return get_flat(model)
    secret = RecordDPParams(clip_norm=1.0, noise_multiplier=1.0)
    assert not np.array_equal(run(secret, 0), run(secret, 0))
    seeded = RecordDPParams(clip_norm=1.0, noise_multiplier=1.0, noise_seed=7)
    assert np.array_equal(run(seeded, 0), run(seeded, 1))


# ------------------------------------------------------------------------------------------ (3) clipping bounds
def test_every_step_moves_at_most_lr_times_batch_clip_over_the_expected_batch():
    """z ≈ 0, C small, plain SGD: each step's parameter change is -lr (Σ_i clip_C(g_i)) / B with B = q·n the
    *expected* batch size (Opacus's mean), so ||Δw|| <= lr·|S|·C/B; a one-record batch moves exactly lr·C/B
    (its gradient is clipped), an empty one not at all."""
    X, y = _data(20)
    C, lr = 0.01, 0.5
    cfg = LocalTrainConfig(epochs=2, batch_size=1, lr=lr, weight_decay=0.0,
                           dp_sgd=RecordDPParams(clip_norm=C, noise_multiplier=1e-10, noise_seed=11))
    model = build_model(MODEL, seed=2)
    log, handle = _record_forwards(model)
    FedAvg().client_update(model, get_flat(model), X, y, cfg, np.random.default_rng(0))
    handle.remove()
    after = [p.detach().clone() for p in model.parameters()]
    sizes, moves = [], []
    for k, (xb, before) in enumerate(log):
        nxt = log[k + 1][1] if k + 1 < len(log) else after
        moves.append(math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(nxt, before))))
        sizes.append(len(xb))
    bound = [lr * s * C / 1 for s in sizes]  # B = q·n = 1
    assert all(m <= b * (1 + 1e-5) + 1e-9 for m, b in zip(moves, bound)), list(zip(moves, bound))
    ones = [m for m, s in zip(moves, sizes) if s == 1]
    assert ones and all(m == pytest.approx(lr * C, rel=1e-4) for m in ones)
    assert all(m < 1e-8 for m, s in zip(moves, sizes) if s == 0) and 0 in sizes


# ------------------------------------------------------------------------------------------ (4) refusals
class _BN(nn.Module):
    def __init__(self):
        super().__init__()
        self.task, self.target = "classification", (0.0, 1.0)
        self.net = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.net(x)


def _user_train(model, loader, ctx):
    opt = ctx.optimizer()
    for _ in range(ctx.epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return {"loss": 1.0}


@pytest.mark.parametrize("user_loop", [False, True])
def test_a_batchnorm_model_is_refused_naming_the_field(user_loop):
    X, y = _data(30)
    cfg = LocalTrainConfig(batch_size=5, dp_sgd=RecordDPParams(clip_norm=1.0, noise_multiplier=1.0))
    s, model = FedAvg(), _BN()
    if user_loop:
        s.loop = UserLoop(_user_train, None, "c1", "fedavg", cfg)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"params\.record_dp.*params\.model.*BatchNorm"):
        s.local_train(model, X, y, cfg, np.random.default_rng(0))
    assert s.record_dp.steps == 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_the_user_loop_trains_privately():
    """A user's loop through ctx.optimizer(): Opacus's Poisson loader, every step accounted, loss not returned,
    the model plain afterwards; a second optimiser in the round is refused."""
    X, y = _data(30)
    cfg = LocalTrainConfig(epochs=2, batch_size=5, lr=0.1,
                           dp_sgd=RecordDPParams(clip_norm=1.0, noise_multiplier=1.0, noise_seed=2))
    s, model = FedAvg(), build_model(MODEL, seed=0)
    s.loop = UserLoop(_user_train, None, "c1", "fedavg", cfg)
    start = get_flat(model)
    upd = s.client_update(model, start, X, y, cfg, np.random.default_rng(0))
    assert upd.steps == s.record_dp.steps == 2 * 6 and math.isnan(upd.loss) and s.record_dp.last_loss == 1.0
    assert not np.array_equal(get_flat(model), start)
    _opacus_free(model)

    def two(model, loader, ctx):
        ctx.optimizer()
        ctx.wrap(torch.optim.Adam(model.parameters()))
    s.loop = UserLoop(two, None, "c1", "fedavg", cfg)
    with pytest.raises(ValueError, match="one optimiser a round"):
        s.client_update(model, start, X, y, cfg, np.random.default_rng(0))
    _opacus_free(model)


def test_other_strategies_and_the_batched_trainer_are_refused():
    X, y = _data(30)
    cfg = LocalTrainConfig(dp_sgd=RecordDPParams(clip_norm=1.0, noise_multiplier=1.0))

    class Other(FedAvg):
        name = "ifca"
    with pytest.raises(ValueError, match=r"params\.record_dp: DP-SGD covers .*ifca"):
        Other().local_train(build_model(MODEL, seed=0), X, y, cfg, None)
    s = FedAvg()
    s.trainer = object()
    with pytest.raises(ValueError, match="batched simulation trainer"):
        s.local_train(build_model(MODEL, seed=0), X, y, cfg, None)


def test_settings_validate():
    with pytest.raises(pydantic.ValidationError, match="give one of the two"):
        RecordDPParams(clip_norm=1.0)
    with pytest.raises(pydantic.ValidationError, match="give one of the two"):
        RecordDPParams(clip_norm=1.0, noise_multiplier=1.0, target_epsilon=1.0)
    with pytest.raises(pydantic.ValidationError):
        RecordDPParams(clip_norm=1.0, noise_multiplier=1.0, sigma=2)
    with pytest.raises(pydantic.ValidationError):
        RecordDPParams(clip_norm=0.0, noise_multiplier=1.0)
    with pytest.raises(pydantic.ValidationError):
        RecordDPParams(clip_norm=1.0, noise_multiplier=1.0, accountant="pld")
    with pytest.raises(ValueError, match=r"target_epsilon: calibrating z needs the job's rounds"):
        RecordDP(RecordDPParams(clip_norm=1.0, target_epsilon=1.0), 100, 10, 1)


# ------------------------------------------------------------------------------------------ (5) calibration
@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_target_epsilon_is_met_after_the_jobs_rounds(accountant):
    """Each client calibrates z for its own q over rounds · epochs · ⌊1/q⌋ steps; after training every round its
    ε is at most the target and within Opacus's bisection tolerance (0.01) of it."""
    X, y = _data(40)
    params = RecordDPParams(clip_norm=1.0, target_epsilon=3.0, accountant=accountant, noise_seed=1)
    cfg = LocalTrainConfig(epochs=2, batch_size=8, lr=0.1, dp_sgd=params, dp_sgd_rounds=3)
    s, model = FedAvg(), build_model(MODEL, seed=0)
    for _ in range(3):
        s.client_update(model, get_flat(model), X, y, cfg, None)
    dp = s.record_dp
    assert dp.steps == 3 * 2 * 5
    eps = dp.epsilon()
    assert 3.0 - 0.011 <= eps <= 3.0
    assert eps == pytest.approx(record_epsilon(dp.noise_multiplier, 0.2, 30, 1e-5, accountant=accountant), abs=1e-6)
    with pytest.raises(ValueError, match="cannot be met"):
        RecordDP(RecordDPParams(clip_norm=1.0, target_epsilon=1e-6, delta=1e-5), 40, 40, 50, rounds=100)


# ------------------------------------------------------------------------------------------ (6) across rounds
def test_the_accountant_composes_every_round_and_the_model_stays_plain():
    """Three rounds: the steps accumulate, ε grows strictly and equals record_epsilon (and secureflhv.dp's
    dpsgd_epsilon) of the steps so far; hooks are removed after each round; changed settings are refused;
    a checkpoint's state restores the accountant."""
    from secureflhv.dp import dpsgd_epsilon

    X, y = _data(50)
    cfg = LocalTrainConfig(batch_size=10, lr=0.1, dp_sgd=RecordDPParams(clip_norm=1.0, noise_multiplier=1.2,
                                                                        delta=1e-6))
    s, model = make_strategy("fednova"), build_model(MODEL, seed=0)
    eps = [0.0]
    for r in range(1, 4):
        upd = s.client_update(model, get_flat(model), X, y, cfg, None)
        dp = s.record_dp
        assert (upd.steps, dp.steps, dp.rounds) == (5, 5 * r, r)
        assert upd.parts["nova"][0][0] == 5.0  # a_i: the fixed step count
        eps.append(dp.epsilon())
        assert eps[-1] == pytest.approx(record_epsilon(1.2, 0.2, 5 * r, 1e-6), abs=1e-9)
        assert eps[-1] == pytest.approx(dpsgd_epsilon(1.2, 0.2, 5 * r, 1e-6), abs=1e-9)
        _opacus_free(model)
    assert all(a < b for a, b in zip(eps, eps[1:]))
    rec = dp.record()
    assert rec | {"epsilon": 0} == {"epsilon": 0, "delta": 1e-6, "mechanism": "DP-SGD (Opacus)", "unit": "record",
                                    "clip_norm": 1.0, "noise_multiplier": 1.2, "sample_rate": 0.2, "steps": 15,
                                    "rounds": 3, "accountant": "rdp"}
    with pytest.raises(ValueError, match="changed between rounds"):
        s.client_update(model, get_flat(model), X[:40], y[:40], cfg, None)
    fresh = RecordDP(cfg.dp_sgd, 50, 10, 1)
    fresh.load_state_dict(dp.state_dict())
    assert fresh.epsilon() == eps[-1] and fresh.steps == 15


def test_a_regression_head_and_dataset_rows_train_privately():
    """Float targets (the MSE head) and a torch Dataset's rows (DatasetRows) go through the same private loop."""
    from torch.utils.data import TensorDataset

    from secureflhv.horizontal.local_data import DatasetRows

    X, y = _data(30)
    cfg = LocalTrainConfig(batch_size=5, dp_sgd=RecordDPParams(clip_norm=1.0, noise_multiplier=1.0, noise_seed=4))
    reg = build_model(ModelSpec(name="mlp", task="regression", n_features=5, hidden=(8,)), seed=0)
    s = FedAvg()
    start = get_flat(reg)
    assert s.client_update(reg, start, X, y.astype(np.float32), cfg, None).steps == 6
    assert np.isfinite(s.record_dp.last_loss) and not np.array_equal(get_flat(reg), start)
    rows = DatasetRows(TensorDataset(torch.from_numpy(X), torch.from_numpy(y)))
    a, b = build_model(MODEL, seed=0), build_model(MODEL, seed=0)
    FedAvg().client_update(a, get_flat(a), rows, y, cfg, None)
    FedAvg().client_update(b, get_flat(b), X, y, cfg, None)
    np.testing.assert_allclose(get_flat(a), get_flat(b), atol=1e-6)  # same seed: same batches and noise
