"""The FL layer's wire checks: a global-model bundle must carry exactly the model's float32 parameters
(names, shapes, finite values) and a known command, else the client rejects it (ProtocolError) and
keeps waiting; a valid bundle round-trips to the same flat vector."""
from __future__ import annotations

import numpy as np
import pytest

from secureflhv.horizontal.fl import FLConfig, HorizontalClient, model_bundle, read_model
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat, param_shapes
from secureflhv.horizontal.strategies import make_strategy
from secureflhv.proto import messages_pb2
from secureflhv.transport.base import ProtocolError
from secureflhv.transport.inprocess import InProcessNetwork

SPEC = ModelSpec(name="mlp", n_features=5, n_classes=3)


def client(strategy="scaffold"):
    net = InProcessNetwork("wire", ["server", "c0"])
    X = np.zeros((4, 5), np.float32)
    y = np.array([0, 1, 2, 0])
    return HorizontalClient(net.transport("c0"), "server", X, y, X[:0], y[:0], SPEC, make_strategy(strategy),
                            FLConfig(rounds=1))


def good_bundle():
    model = build_model(SPEC, seed=1)
    vec = get_flat(model)
    b = model_bundle(param_shapes(model), vec, command="train", participants="c0,c1")
    return b, vec, param_shapes(model)


def test_valid_bundle_round_trips():
    b, vec, shapes = good_bundle()
    assert np.array_equal(read_model(messages_pb2.Bundle.FromString(b.SerializeToString()), shapes), vec)
    c = client("fedavg")
    assert c._parse_round(b.SerializeToString()).text["command"] == "train"


def _mutations():
    def wrong_shape(b):
        t = b.tensors["model/net.0.weight"]
        t.shape[:] = [t.shape[1], t.shape[0]]

    def wrong_dtype(b):
        t = b.tensors["model/net.0.bias"]
        t.dtype = "<f8"

    def short_data(b):
        t = b.tensors["model/net.0.bias"]
        t.data = t.data[:-4]

    def nan(b):
        t = b.tensors["model/net.0.bias"]
        t.data = np.full(len(t.data) // 4, np.nan, "<f4").tobytes()

    def missing(b):
        del b.tensors["model/net.2.weight"]

    def extra(b):
        b.tensors["model/backdoor"].CopyFrom(b.tensors["model/net.0.bias"])

    def command(b):
        b.text["command"] = "exec"

    def bad_extra(b):
        b.tensors["extra/control"].CopyFrom(b.tensors["model/net.0.bias"])  # wrong length

    return [wrong_shape, wrong_dtype, short_data, nan, missing, extra, command, bad_extra]


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_bad_bundle_is_rejected(mutate):
    b, _, _ = good_bundle()
    mutate(b)
    with pytest.raises(ProtocolError):
        client()._parse_round(b.SerializeToString())


def test_one_model_validator_for_fl_and_multiconfederated():
    """model_tensors: the FL client leaves other tensors (extra/...) alone; a MultiConfederated update
    (``only``) may carry nothing but its models; names and shapes are checked either way."""
    from secureflhv.horizontal.model_wire import model_tensors

    b, vec, shapes = good_bundle()
    b.tensors["extra/c"].CopyFrom(b.tensors["model/net.0.bias"])
    got = model_tensors(b, shapes, "fl")
    assert list(got) == list(shapes) and all(got[n].shape == s and got[n].dtype == np.float32 for n, s in shapes.items())
    with pytest.raises(ProtocolError, match=r"^mc\.update from p1: model parameters .*extra/c"):
        model_tensors(b, shapes, "mc.update from p1", only=True)
    with pytest.raises(ProtocolError, match="do not match"):
        model_tensors(b, dict(list(shapes.items())[1:]))
    with pytest.raises(ProtocolError, match="model/net.0.bias"):
        model_tensors(b, {**shapes, "net.0.bias": (7,)}, "fl")
