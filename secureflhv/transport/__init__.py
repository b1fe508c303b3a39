"""Layer 2: how bytes move between parties. Nothing above this layer imports grpc."""
from .base import (ABORT_TAG, DEFAULT_DEADLINE_S, DEFAULT_MAX_PAYLOAD_BYTES, PROBE_TAG, JobAborted, Mailbox,
                   Message, MessageRejected, PeerLost, PeerTimeout, PeerUnavailable, ProtocolError, Rejected,
                   Transport, TransportError, parse_message)
from .inprocess import InProcessNetwork, InProcessTransport

__all__ = ["ABORT_TAG", "DEFAULT_DEADLINE_S", "DEFAULT_MAX_PAYLOAD_BYTES", "PROBE_TAG", "JobAborted", "Mailbox",
           "Message", "MessageRejected", "PeerLost", "PeerTimeout", "PeerUnavailable", "ProtocolError", "Rejected", "Transport",
           "TransportError", "parse_message",
           "InProcessNetwork", "InProcessTransport"]
