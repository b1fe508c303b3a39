"""secureflhv.params: one set of bounds per concept, shared by every job that embeds it."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from secureflhv.params import EarlyStopping, HEParams, with_defaults
from secureflhv.secagg import AggregationConfig, AggregationConfigError
from secureflhv.tree.params import SecureBoostParams
from secureflhv.vertical.lr import VerticalLRConfig
from secureflhv.vertical.split_nn import SplitNNConfig

TEST_KEY = {"key_bits": 512, "insecure_test_key": True}


@pytest.mark.parametrize("model", [VerticalLRConfig, SplitNNConfig])
def test_precision_bounds_are_the_same_for_every_vertical_job(model):
    for bits in (16, 64):
        assert model(**TEST_KEY, precision_bits=bits).precision_bits == bits
    for bits in (15, 65, 128):
        with pytest.raises(ValidationError, match="precision_bits"):
            model(**TEST_KEY, precision_bits=bits)
    assert model(**TEST_KEY, dot_precision_bits=52).dot_precision_bits == 52
    with pytest.raises(ValidationError, match="dot_precision_bits"):
        model(**TEST_KEY, dot_precision_bits=53)


@pytest.mark.parametrize("model", [HEParams, VerticalLRConfig, SplitNNConfig, SecureBoostParams])
def test_a_short_key_needs_the_test_flag(model):
    with pytest.raises(ValidationError, match="key_bits: 1024 < 2048 needs insecure_test_key=True"):
        model(key_bits=1024)


def test_with_defaults_keeps_bounds_and_description():
    variant = with_defaults(EarlyStopping, early_stopping_rounds=7)
    assert variant().early_stopping_rounds == 7 and EarlyStopping().early_stopping_rounds is None
    assert variant.model_fields["early_stopping_rounds"].description == \
        EarlyStopping.model_fields["early_stopping_rounds"].description
    with pytest.raises(ValidationError):
        variant(early_stopping_rounds=0)


def test_tree_min_delta_zero_is_strict_improvement():
    from secureflhv.tree.model import BoostedModel
    import numpy as np

    model = BoostedModel(SecureBoostParams(early_stopping_rounds=2), np.zeros(1))
    assert [model.record_validation(r, v) for r, v in enumerate([1.0, 0.9, 0.9, 0.9])] == [False, False, False, True]
    assert model.best_round == 1
    model = BoostedModel(SecureBoostParams(early_stopping_rounds=2, min_delta=0.2), np.zeros(1))
    assert [model.record_validation(r, v) for r, v in enumerate([1.0, 0.9, 0.85])] == [False, False, True]
    assert model.best_round == 0


@pytest.mark.parametrize("kw, field, text", [
    ({"threshold": 0.5}, "threshold", "threshold fraction must be in (1/2, 1]"),
    ({"min_clients": 1}, "min_clients", "min_clients must be an int >= 2"),
    ({"max_colluders": -1}, "max_colluders", "max_colluders must be an int >= 0"),
    ({"kind": "paillier"}, "kind", "aggregation kind 'paillier' unknown"),
    ({"stage_timeout_s": 0}, "stage_timeout_s", "stage_timeout_s must be > 0"),
    ({"job_clients": ("a", "a")}, "job_clients", "job_clients has duplicates"),
])
def test_aggregation_config_errors_name_the_field(kw, field, text):
    with pytest.raises(AggregationConfigError) as exc:
        AggregationConfig(**kw)
    assert exc.value.field == field and str(exc.value).startswith(text)


def test_aggregation_config_replace_validates_again():
    cfg = AggregationConfig(threshold=3, job_clients=("a", "b", "c"))
    assert cfg.replace(clip=2.0).clip == 2.0 and cfg.replace(clip=2.0).threshold == 3
    with pytest.raises(AggregationConfigError, match="clip must be positive"):
        cfg.replace(clip=-1.0)
    with pytest.raises(AggregationConfigError) as exc:
        cfg.resolve_threshold(2)
    assert exc.value.field == "min_clients"
