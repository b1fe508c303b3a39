"""Pieces shared by the vertical protocols (logistic regression and split NN)."""
from __future__ import annotations

import numpy as np

from ..crypto.homomorphic.backend import Mask
from ..crypto.homomorphic.paillier_encoding import DEFAULT_SCALAR_PRECISION_BITS
from ..proto import messages_pb2
from ..transport import ProtocolError, Transport, parse_message
from ..transport.he_codec import backend_and_codec
from ..transport.role import ProtocolRole
from ..transport.round_layout import RoundLayout

MAX_BATCHES = 1_000_000  # batches per epoch that fit in the round-id scheme
STEPS_PER_BATCH = 10     # message steps inside one batch (round = batch base + step)
BATCH_ROUNDS = RoundLayout("vertical batch", (("epoch", None), ("batch", MAX_BATCHES), ("step", STEPS_PER_BATCH)))


def round_id(epoch: int, batch: int, step: int) -> int:
    """Round id of ``step`` (0..9) of ``batch`` in ``epoch``: ``epoch * 10 * MAX_BATCHES + batch * 10 + step``,
    strictly increasing in (epoch, batch, step). ValueError for a field out of its range."""
    return BATCH_ROUNDS.pack(epoch=epoch, batch=batch, step=step)


def control_parser(epoch: int):
    """``parse`` callback for the guest's end-of-epoch Control message ("continue" / "stop")."""
    def validate(m: messages_pb2.Control):
        if m.command not in ("continue", "stop") or m.epoch != epoch:
            raise ProtocolError(f"control {m.command!r} for epoch {m.epoch}, expected continue/stop for {epoch}")
        return m
    return parse_message(messages_pb2.Control, validate)


class VerticalRole(ProtocolRole):
    """Base of the vertical LR and split-NN roles: a homomorphic backend, its wire codec, and the masked
    decryption exchange both protocols use (Hardy et al. 2017 sec. 3; :mod:`secureflhv.crypto.homomorphic.backend`).

    Args:
        transport: this party's transport.
        backend: "paillier" (default, also for None), "identity" (NO encryption: benchmark baseline
            only) or an :class:`~secureflhv.crypto.homomorphic.backend.HEBackend` instance.
        precision_bits, dot_precision_bits: fixed-point precision of encrypted values / plaintext factors.
    """

    def __init__(self, transport: Transport, backend, precision_bits: int | None, dot_precision_bits: int):
        super().__init__(transport)
        self.he, self.wire = backend_and_codec(backend, precision_bits, dot_precision_bits)

    def _exponent(self, dots: int = 0, scaled: int = 0) -> int:
        """The fixed-point exponent an honest sender's ciphertexts carry: a fresh encryption
        (``-precision_bits``) after ``dots`` products with a plaintext (``-dot_precision_bits`` each:
        dot / matmul / t_matmul / matmul_t) and ``scaled`` multiplications by a non-integral float
        (``-DEFAULT_SCALAR_PRECISION_BITS`` each). Every party computes it from the shared config, so a
        received tensor must carry exactly this (a peer-chosen exponent could stall the receiver:
        :mod:`secureflhv.transport.he_codec`). The identity backend ignores it (always 0)."""
        he = self.he
        return -(he.precision_bits + dots * he.dot_precision_bits + scaled * DEFAULT_SCALAR_PRECISION_BITS)

    def _enc_parser(self, pub, shape, what: str, exponent: int):
        """``parse`` for a peer's EncryptedTensor under ``pub``: exactly ``shape`` and ``exponent``."""
        return self.wire.enc_parser(pub, shape, what, exponent=exponent)

    def _masked_parser(self, pub, shape, what: str, exponent: int):
        return self.wire.masked_parser(pub, shape, what, exponent=exponent)

    def _send_enc(self, peer: str, tag: str, enc, rnd: int) -> None:
        self.t.send(peer, tag, self.wire.to_proto(enc), round=rnd)

    def _ask_decrypt(self, pub, enc, holder: str, tag: str, rnd: int) -> Mask:
        """Send ``enc`` under a fresh uniform mask to the key holder; return the mask (kept here)."""
        masked, mask = self.he.mask(pub, enc)
        self._send_enc(holder, tag, masked, rnd)
        return mask

    def _take_decrypted(self, pub, mask: Mask, holder: str, tag: str, rnd: int, shape) -> np.ndarray:
        """Receive the key holder's masked plaintexts and unmask them -> float64 of ``shape``."""
        msg = self.t.recv(holder, tag, round=rnd,
                          parse=self._masked_parser(pub, shape, f"{tag} from {holder}", mask.exponent))
        return self.he.unmask(pub, msg, mask)

    def _send_decrypted(self, priv, enc, peer: str, tag: str, rnd: int, add=None) -> None:
        """Key holder: decrypt masked ciphertexts (plus its own term ``add``) and send the residues back."""
        self.t.send(peer, tag, self.wire.masked_to_proto(self.he.decrypt_masked(priv, enc, add), priv), round=rnd)
