"""The fuzzing inventory: every tag a receiver parses, who receives it, with which parser and class.

``INVENTORY[tag] = Entry(run, receivers, cls, parser)``: ``run`` names the in-process run in
:mod:`protocols` that captures it (a real message of an honest run, and the receiver's real parse
callback), ``receivers`` the receiving roles (party ids of that run), ``cls`` the protobuf class
on the wire, ``parser`` where the parse callback comes from. ``RECV_SITES`` maps every ``.recv(`` and
``gather(`` (transport/collectives.py) call site of secureflhv/ (file, function, tag expression) to the tags it
receives: a new call site or tag fails ``test_inventory`` until it is added here, so every future receiver is fuzzed too.
"""
from __future__ import annotations

from typing import NamedTuple

from secureflhv.proto import messages_pb2 as m
from secureflhv.proto import psi_pb2 as p
from secureflhv.proto import secagg_pb2 as s
from secureflhv.proto import tree_pb2 as t


class Entry(NamedTuple):
    run: str
    receivers: tuple[str, ...]
    cls: type
    parser: str


E = Entry
INVENTORY: dict[str, Entry] = {
    # rendezvous before every protocol (runtime/process/rendezvous.py)
    "__hello__": E("rendezvous", ("guest", "host-1"), m.Bundle, "rendezvous._parse_hello"),
    # checkpoint step agreement at start-up (runtime/store/resume.py)
    "resume.steps": E("resume", ("guest", "host-1", "server"), m.Bundle, "resume.parse_steps"),
    # online serving (runtime/serve/federation.py): the guest's steps and the hosts' replies
    "serve.ctl": E("serve", ("host-1",), m.Bundle, "federation._check_ctl"),
    "serve.reply": E("serve", ("guest",), m.Bundle, "federation._reply_parser (score) / parse_message(Bundle) (swap)"),
    # ECDH-PSI (vertical/psi.py)
    "psi/hello": E("psi", ("host-1",), p.PsiHello, "psi._hello_parser"),
    "psi/points": E("psi", ("guest", "host-1"), p.PsiPoints, "psi._points_parser(points=True)"),
    "psi/double": E("psi", ("guest",), p.PsiPoints, "psi._points_parser(points=False)"),
    "psi/intersection": E("psi", ("host-1",), p.PsiIntersection, "psi._intersection_parser"),
    # KKRT-PSI (vertical/psi_kkrt.py; its hello and intersection are ECDH-PSI's)
    "psi/kkrt/base_ot": E("psi_kkrt", ("guest",), p.KkrtBaseOt, "psi_kkrt._base_ot_parser"),
    "psi/kkrt/matrix": E("psi_kkrt", ("host-1",), p.KkrtMatrix, "psi_kkrt._matrix_parser (part 0; later parts too)"),
    "psi/kkrt/matrix_ack": E("psi_kkrt", ("guest",), p.KkrtMatrix, "psi_kkrt._ack_parser"),
    "psi/kkrt/oprf": E("psi_kkrt", ("guest",), p.PsiPoints, "psi_kkrt._oprf_parser (part 0; later parts too)"),
    "psi/kkrt/oprf_ack": E("psi_kkrt", ("host-1",), p.PsiPoints, "psi_kkrt._values_ack_parser"),
    # vertical LR (vertical/lr.py, vertical/common.py, transport/he_codec.py)
    "vlr.setup": E("vlr_arbiter", ("host-1", "host-2", "server"), m.Bundle, "parse_message(Bundle) + _check_setup"),
    "vlr.pubkey": E("vlr_arbiter", ("guest", "host-1", "host-2"), m.PaillierPublicKey, "_pubkey_parser"),
    "vlr.hello": E("vlr_arbiter", ("guest", "server"), m.Scalars, "lr._scalars_parser"),
    "vlr.fwd": E("vlr_arbiter", ("guest",), m.Bundle, "fwd_parser (in _batch_arbiter/_batch_two_party)"),
    "vlr.d": E("vlr_arbiter", ("host-1", "host-2"), m.EncryptedTensor, "_enc_parser"),
    "vlr.cross_in": E("vlr_arbiter", ("host-1", "host-2"), m.EncryptedTensor, "_enc_parser"),
    "vlr.mask_key": E("vlr_arbiter", ("host-1", "host-2"), m.Bundle, "host_masks._key_parser"),
    "vlr.cross": E("vlr_arbiter", ("guest",), m.EncryptedTensor, "_enc_parser"),
    "vlr.grad": E("vlr_arbiter", ("server",), m.EncryptedTensor, "_enc_parser (_serve_decrypt)"),
    "vlr.grad_dec": E("vlr_arbiter", ("guest", "host-1", "host-2"), m.MaskedValues, "common._masked_parser"),
    "vlr.loss": E("vlr_arbiter", ("server",), m.EncryptedTensor, "_enc_parser (_serve_decrypt)"),
    "vlr.loss_dec": E("vlr_arbiter", ("guest",), m.MaskedValues, "common._masked_parser"),
    "vlr.best": E("vlr_arbiter", ("host-1", "host-2"), m.Scalars, "lr._best_epoch_parser"),
    "vlr.ctl": E("vlr_arbiter", ("host-1", "host-2", "server"), m.Control, "common.control_parser"),
    "vlr.pred_req": E("vlr_arbiter", ("host-1", "host-2"), m.RowsRequest, "prediction._request_parser"),
    "vlr.pred": E("vlr_two_party", ("guest",), m.Tensor, "parse_message(Tensor, float64 check) in _predict"),
    # vertical LR prediction in arbiter mode (vertical/lr_scores.py)
    "vlr.pred_key": E("vlr_arbiter", ("guest", "host-1", "host-2"), m.PaillierPublicKey,
                      "_pubkey_parser (lr_scores._score_key)"),
    "vlr.pred_enc": E("vlr_arbiter", ("guest",), m.EncryptedTensor, "_enc_parser (lr_scores._encrypted_total)"),
    "vlr.pred_dec": E("vlr_arbiter", ("server",), m.Bundle, "lr_scores._score_request_parser"),
    "vlr.pred_total": E("vlr_arbiter", ("guest",), m.MaskedValues, "common._masked_parser"),
    # split NN (vertical/split_nn.py, transport/he_codec.py)
    "vnn.setup": E("split_nn", ("host-1",), m.Bundle, "parse_message(Bundle) + _check_setup"),
    "vnn.hello": E("split_nn", ("guest",), m.PaillierPublicKey, "wire.public_key_parser"),
    "vnn.fwd": E("split_nn", ("guest",), m.EncryptedTensor, "_enc_parser"),
    "vnn.fwd_masked": E("split_nn", ("host-1",), m.EncryptedTensor, "_enc_parser"),
    "vnn.fwd_dec": E("split_nn", ("guest",), m.MaskedValues, "common._masked_parser"),
    "vnn.gw": E("split_nn", ("host-1",), m.EncryptedTensor, "_enc_parser"),
    "vnn.gw_dec": E("split_nn", ("guest",), m.MaskedValues, "common._masked_parser"),
    "vnn.acc": E("split_nn", ("guest",), m.EncryptedTensor, "_enc_parser"),
    "vnn.gin": E("split_nn", ("host-1",), m.EncryptedTensor, "_enc_parser"),
    "vnn.ctl": E("split_nn", ("host-1",), m.Control, "common.control_parser"),
    "vnn.pred_req": E("split_nn", ("host-1",), m.RowsRequest, "prediction._request_parser"),
    "vnn.pred_fwd": E("split_nn", ("guest",), m.EncryptedTensor, "_enc_parser"),
    "vnn.pred_masked": E("split_nn", ("host-1",), m.EncryptedTensor, "_enc_parser"),
    "vnn.pred_dec": E("split_nn", ("guest",), m.MaskedValues, "common._masked_parser"),
    # vertical SecureBoost (tree/vertical.py)
    "sb.setup": E("sb_vertical", ("host-1",), t.SbSetup, "parse_message(SbSetup, _check_setup)"),
    "sb.hello": E("sb_vertical", ("guest",), t.SbHello, "parse_message(SbHello)"),
    "sb.start": E("sb_vertical", ("host-1",), t.SbTreeStart, "_parse_start"),
    "sb.rows": E("sb_vertical", ("host-1",), t.SbRowPart, "check in _receive_rows"),
    "sb.rows_ack": E("sb_vertical", ("guest",), t.SbRowPart, "check in _rows_ack"),
    "sb.plan": E("sb_vertical", ("host-1",), t.SbLevelPlan, "parse_message(SbLevelPlan, ...) in _tree"),
    "sb.hist": E("sb_vertical", ("guest",), t.SbHistograms, "_hist_parser"),
    "sb.decide": E("sb_vertical", ("host-1",), t.SbDecision, "parse_message(SbDecision, ...) in _tree"),
    "sb.split": E("sb_vertical", ("guest",), t.SbSplitResults, "_split_parser"),
    "sb.route": E("sb_vertical", ("host-1",), t.SbRouteRequest, "_check_route"),
    "sb.routed": E("sb_vertical", ("guest",), t.SbRouteReply, "_route_reply_parser"),
    # federated WOE binning (vertical/woe_binning.py)
    "woe.setup": E("woe", ("host-1",), t.SbSetup, "parse_message(SbSetup, _check_setup)"),
    "woe.counts": E("woe", ("guest",), m.Bundle, "_counts_parser"),
    "woe.start": E("woe", ("host-1",), t.SbTreeStart, "check in _start"),
    "woe.rows": E("woe", ("host-1",), t.SbRowPart, "check in _receive_rows"),
    "woe.rows_ack": E("woe", ("guest",), t.SbRowPart, "check in _ack"),
    "woe.sums": E("woe", ("guest",), t.SbHistograms, "_sums_parser"),
    "woe.result": E("woe", ("host-1",), m.Bundle, "parse_message(Bundle, _check_result)"),
    # cross-party correlation (vertical/correlation.py)
    "corr.setup": E("corr_guest", ("host-1",), m.Bundle, "_setup_parser"),
    "corr.pubkey": E("corr_guest", ("host-1",), m.PaillierPublicKey, "wire.public_key_parser"),
    "corr.hello": E("corr_guest", ("guest",), m.Bundle, "_hello_parser"),
    "corr.zg": E("corr_guest", ("host-1",), m.EncryptedTensor, "_enc_parser"),
    "corr.ack": E("corr_guest", ("guest",), m.Scalars, "check in _ack"),
    "corr.result": E("corr_guest", ("guest",), m.EncryptedTensor, "_enc_parser"),
    "corr.masked": E("corr_host", ("guest",), m.EncryptedTensor, "_enc_parser"),
    "corr.unmask": E("corr_host", ("host-1",), m.MaskedValues, "common._masked_parser"),
    # feature selection by importance (vertical/selection.py)
    "fs.importance": E("selection", ("guest",), m.Bundle, "selection.receive_importance check"),
    "fs.keep": E("selection", ("host-1",), m.Bundle, "selection.receive_keep check"),
    # a scorecard's per-row totals (vertical/score_totals.py)
    "sc.totals": E("score_totals", ("guest",), m.Bundle, "score_totals._parser"),
    # horizontal SecureBoost (tree/horizontal.py)
    "hsb.hello": E("sb_horizontal", ("server",), t.SbHello, "parse_message(SbHello)"),
    "hsb.ranges": E("sb_horizontal", ("client-0", "client-1", "server"), t.HsbRanges, "check / check_ranges"),
    "hsb.cuts": E("sb_horizontal", ("client-0", "client-1"), t.HsbCuts, "_check_cuts"),
    "hsb.tree": E("sb_horizontal", ("client-0", "client-1"), t.HsbLevel, "parse_message(HsbLevel)"),
    "hsb.bound": E("sb_horizontal", ("server",), t.HsbBound, "parse_message(HsbBound)"),
    "hsb.level": E("sb_horizontal", ("client-0", "client-1"), t.HsbLevel, "parse_message(HsbLevel, ...) in level loop"),
    # horizontal FL (horizontal/fl.py)
    "fl.round": E("fl", ("c0", "c1"), m.Bundle, "HorizontalClient._parse_round"),
    "fl.eval": E("fl", ("c0", "c1"), m.Bundle, "HorizontalClient._parse_round"),
    "fl.metrics": E("fl", ("server",), m.Scalars, "_collect_metrics.validate"),
    "fl.layout": E("fl", ("server",), m.Bundle, "_agree_layout.validate"),
    # client contribution normalisation (horizontal/contribution.py)
    "fl.latent_sum": E("fl_contrib", ("c0", "c1"), m.Bundle, "ContributionClient._latent_parser"),
    "fl.exp_sum": E("fl_contrib", ("c0", "c1"), m.Bundle, "ContributionClient._exp_parser"),
    # MultiConfederated learning, peer to peer (horizontal/mc_peer.py)
    "mc.update": E("mc", ("p0", "p1", "p2"), m.Bundle, "MultiConfederatedPeer.parser"),
    # federated preprocessing statistics (fedstats/preprocessing.py)
    "fpp.hello": E("fed_stats", ("server",), m.Bundle, "parse_message(Bundle, _layout_check)"),
    "fpp.ranges": E("fed_stats", ("client-0", "client-1"), m.Bundle, "_vector_parser(dim_a)"),
    "fpp.stats": E("fed_stats", ("client-0", "client-1"), m.Bundle, "_vector_parser(dim_b)"),
    # secure aggregation (secagg/plain.py, bonawitz_server.py, bonawitz_client.py)
    "agg.plain": E("fl", ("server",), s.PlainInput, "PlainServer._validate"),
    "agg.advertise": E("secagg", ("server",), s.AdvertiseKeys, "advertise check"),
    "agg.share": E("secagg", ("server",), s.ShareKeys, "share check (parse_for)"),
    "agg.masked": E("secagg", ("server",), s.MaskedInput, "masked check"),
    "agg.sign": E("secagg", ("server",), s.ConsistencySignature, "signature check (parse_for)"),
    "agg.unmask": E("secagg", ("server",), s.UnmaskResponse, "unmask check"),
    "agg.server": E("secagg", ("client0", "client1", "client2"), s.ServerMessage, "SecAggClient._from_server validate"),
}

_PSI = ("psi/hello", "psi/points", "psi/double", "psi/intersection", "psi/kkrt/base_ot", "psi/kkrt/matrix",
        "psi/kkrt/matrix_ack", "psi/kkrt/oprf", "psi/kkrt/oprf_ack")
_HSB = ("hsb.hello", "hsb.ranges", "hsb.cuts", "hsb.tree", "hsb.bound", "hsb.level")
_AGG = ("agg.plain", "agg.advertise", "agg.share", "agg.masked", "agg.sign", "agg.unmask")
RECV_SITES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("horizontal/contribution.py", "factor_for", "TAG_EXP_SUM"): ("fl.exp_sum",),
    ("horizontal/contribution.py", "factor_for", "TAG_LATENT_SUM"): ("fl.latent_sum",),
    ("horizontal/fl.py", "_collect_metrics", "TAG_METRICS"): ("fl.metrics",),
    ("horizontal/fl.py", "_agree_layout", "TAG_LAYOUT"): ("fl.layout",),
    ("horizontal/mc_peer.py", "run_round", "TAG_UPDATE"): ("mc.update",),
    ("fedstats/preprocessing.py", "_hello", "TAG_HELLO"): ("fpp.hello",),
    ("fedstats/preprocessing.py", "_run", "TAG_RANGES"): ("fpp.ranges",),
    ("fedstats/preprocessing.py", "_round_b", "TAG_STATS"): ("fpp.stats",),
    ("horizontal/fl.py", "_serve_rounds", "TAG_EVAL"): ("fl.eval",),
    ("horizontal/fl.py", "_serve_rounds", "TAG_ROUND"): ("fl.round",),
    ("secagg/bonawitz_client.py", "_from_server", "TAG_SERVER"): ("agg.server",),
    ("secagg/exchange.py", "collect_each", "tag"): _AGG,
    ("tree/horizontal.py", "_recv", "tag"): _HSB,
    ("tree/horizontal.py", "_recv_all", "tag"): _HSB,
    ("tree/vertical.py", "_fit", "TAG_SETUP"): ("sb.setup",),
    ("tree/vertical.py", "_fit", "TAG_START"): ("sb.start",),
    ("tree/vertical.py", "_recv", "tag"): ("sb.hello", "sb.hist", "sb.split", "sb.routed", "sb.rows_ack"),
    ("tree/vertical.py", "_receive_rows", "TAG_ROWS"): ("sb.rows",),
    ("tree/vertical.py", "_serve", "TAG_ROUTE"): ("sb.route",),
    ("tree/vertical.py", "_tree", "TAG_DECIDE"): ("sb.decide",),
    ("tree/vertical.py", "_tree", "TAG_PLAN"): ("sb.plan",),
    ("vertical/common.py", "_take_decrypted", "tag"): ("vlr.grad_dec", "vlr.loss_dec", "vnn.fwd_dec", "vnn.gw_dec",
                                                       "vnn.pred_dec", "vlr.pred_total", "corr.unmask"),
    ("vertical/lr_scores.py", "_score_key", "TAG_PRED_KEY"): ("vlr.pred_key",),
    ("vertical/lr_scores.py", "_encrypted_total", "TAG_PRED_ENC"): ("vlr.pred_enc",),
    ("vertical/lr_scores.py", "_serve_scores", "TAG_PRED_DEC"): ("vlr.pred_dec",),
    ("vertical/lr.py", "_batch_arbiter", "TAG_CROSS"): ("vlr.cross",),
    ("vertical/lr.py", "_masked_quadratic", "TAG_CROSS"): ("vlr.cross",),
    ("vertical/host_masks.py", "agree", "TAG_MASK_KEY"): ("vlr.mask_key",),
    ("vertical/lr.py", "_batch_arbiter", "TAG_FWD"): ("vlr.fwd",),
    ("vertical/lr.py", "_batch_two_party", "TAG_FWD"): ("vlr.fwd",),
    ("vertical/lr.py", "_end_epoch", "TAG_CTL"): ("vlr.ctl",),
    ("runtime/process/rendezvous.py", "_await", "TAG_HELLO"): ("__hello__",),
    ("runtime/store/resume.py", "agree_step", "TAG_STEPS"): ("resume.steps",),
    ("runtime/serve/federation.py", "run", "TAG_CTL"): ("serve.ctl",),
    ("runtime/serve/federation.py", "score", "TAG_REPLY"): ("serve.reply",),
    ("runtime/serve/federation.py", "swap", "TAG_REPLY"): ("serve.reply",),
    ("vertical/lr.py", "_fit", "TAG_BEST"): ("vlr.best",),
    ("vertical/lr.py", "_host_batch", "TAG_CROSS_IN"): ("vlr.cross_in",),
    ("vertical/lr.py", "_host_batch", "TAG_D"): ("vlr.d",),
    ("vertical/lr.py", "_fit", "TAG_HELLO"): ("vlr.hello",),
    ("vertical/lr.py", "_fit", "TAG_PUBKEY"): ("vlr.pubkey",),
    ("vertical/lr.py", "_fit", "TAG_SETUP"): ("vlr.setup",),
    ("vertical/lr.py", "_key_exchange", "TAG_HELLO"): ("vlr.hello",),
    ("vertical/lr.py", "_key_exchange", "TAG_PUBKEY"): ("vlr.pubkey",),
    ("vertical/lr.py", "_predict", "TAG_PRED"): ("vlr.pred",),
    ("vertical/lr.py", "_serve_decrypt", "tag_in"): ("vlr.grad", "vlr.loss"),
    ("vertical/prediction.py", "_recv_request", "self.pred_request_tag"): ("vlr.pred_req", "vnn.pred_req"),
    ("vertical/psi.py", "_recv", "tag"): _PSI,
    ("vertical/split_nn.py", "_host_forward", "tf"): ("vnn.fwd", "vnn.pred_fwd"),
    ("vertical/split_nn.py", "_recv", "tag"): ("vnn.setup", "vnn.ctl", "vnn.fwd_masked", "vnn.pred_masked", "vnn.gw",
                                               "vnn.gin", "vnn.pred_req"),
    ("vertical/split_nn.py", "_setup", "TAG_HELLO"): ("vnn.hello",),
    ("vertical/split_nn.py", "_train_batch", "TAG_ACC"): ("vnn.acc",),
    ("vertical/woe_binning.py", "_receive_rows", "TAG_ROWS"): ("woe.rows",),
    ("vertical/woe_binning.py", "_recv", "tag"): ("woe.counts", "woe.sums", "woe.rows_ack"),
    ("vertical/woe_binning.py", "_run", "TAG_RESULT"): ("woe.result",),
    ("vertical/woe_binning.py", "_run", "TAG_SETUP"): ("woe.setup",),
    ("vertical/woe_binning.py", "_start", "TAG_START"): ("woe.start",),
    ("vertical/correlation.py", "_ack", "TAG_ACK"): ("corr.ack",),
    ("vertical/correlation.py", "_run", "TAG_HELLO"): ("corr.hello",),
    ("vertical/correlation.py", "_run", "TAG_PUBKEY"): ("corr.pubkey",),
    ("vertical/correlation.py", "_run", "tag"): ("corr.result", "corr.masked"),
    ("vertical/correlation.py", "_run", "TAG_SETUP"): ("corr.setup",),
    ("vertical/correlation.py", "_run", "TAG_ZG"): ("corr.zg",),
    ("vertical/score_totals.py", "gather_totals", "TAG_TOTALS"): ("sc.totals",),
    ("vertical/selection.py", "receive_importance", "TAG_IMPORTANCE"): ("fs.importance",),
    ("vertical/selection.py", "receive_keep", "TAG_KEEP"): ("fs.keep",),
}
