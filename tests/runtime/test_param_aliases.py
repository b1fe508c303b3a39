"""The old parameter spellings are accepted for one release: each gives the same model as the new name, a
DeprecationWarning and a log line that both name the new field; giving both spellings is an error naming
the old one (docs/parameters.md, "Shared settings, and renamed names")."""
from __future__ import annotations

import logging

import pytest

from secureflhv.params import LocalTraining
from secureflhv.runtime.algorithms.horizontal_fl import HorizontalJobParams
from secureflhv.runtime.algorithms.multiconfederated import MultiConfederatedJobParams
from secureflhv.runtime.job.job_file import params_error
from secureflhv.vertical.lr import VerticalLRConfig

MODEL = {"name": "mlp", "n_features": 4, "n_classes": 2}


def _old_and_new(model, old: dict, new: dict, new_field: str, caplog):
    """The model built from ``old`` (checking the warning and the log line) equals the one from ``new``."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="secureflhv.params"):
        with pytest.warns(DeprecationWarning, match=f"use '{new_field}'"):
            from_old = model(**old)
    assert any(f"use '{new_field}'" in r.getMessage() for r in caplog.records)
    assert from_old == model(**new)
    return from_old


@pytest.mark.parametrize("model", [HorizontalJobParams, MultiConfederatedJobParams])
def test_lr_is_learning_rate(model, caplog):
    p = _old_and_new(model, {"model": MODEL, "lr": 0.2}, {"model": MODEL, "learning_rate": 0.2}, "learning_rate",
                     caplog)
    assert p.learning_rate == 0.2


def test_lr_and_learning_rate_together_are_refused():
    with pytest.raises(ValueError, match="lr: renamed to learning_rate; give learning_rate only") as exc:
        LocalTraining(lr=0.1, learning_rate=0.2)
    assert str(params_error(exc.value)).startswith("params.lr: renamed to learning_rate")


def test_patience_is_early_stopping_rounds(caplog):
    cfg = _old_and_new(VerticalLRConfig, {"patience": 3}, {"early_stopping_rounds": 3}, "early_stopping_rounds",
                       caplog)
    assert cfg.early_stopping_rounds == 3


def test_tol_is_min_delta(caplog):
    cfg = _old_and_new(VerticalLRConfig, {"tol": 0.02}, {"min_delta": 0.02}, "min_delta", caplog)
    assert cfg.min_delta == 0.02


def test_early_stopping_false_is_rounds_null(caplog):
    cfg = _old_and_new(VerticalLRConfig, {"early_stopping": False, "patience": 4}, {"early_stopping_rounds": None},
                       "early_stopping_rounds", caplog)
    assert cfg.early_stopping_rounds is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_early_stopping_true_keeps_patience_or_the_default():
    assert VerticalLRConfig(early_stopping=True).early_stopping_rounds == VerticalLRConfig().early_stopping_rounds == 10
    assert VerticalLRConfig(early_stopping=True, patience=2, tol=1e-3) == \
        VerticalLRConfig(early_stopping_rounds=2, min_delta=1e-3)


def test_early_stopping_with_its_replacement_or_not_a_bool_is_refused():
    with pytest.raises(ValueError, match="early_stopping: replaced by early_stopping_rounds"):
        VerticalLRConfig(early_stopping=True, early_stopping_rounds=3)
    with pytest.raises(ValueError, match="early_stopping: must be true or false"):
        VerticalLRConfig(early_stopping="yes")


def test_new_names_warn_nothing(recwarn):
    VerticalLRConfig(early_stopping_rounds=None, min_delta=0.1)
    HorizontalJobParams(model=MODEL, learning_rate=0.1)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
