"""gRPC credentials from a :class:`~secureflhv.transport.certs.TlsConfig`, and peer identity.

* Servers require a client certificate signed by the job CA (mutual TLS).
* Clients trust only the job CA and check the server certificate against the *receiver's party id*
  (``grpc.ssl_target_name_override``), so a certificate for ``host-1`` is accepted only when we
  meant to reach ``host-1``, whatever address it listens on.
* The server reads the authenticated client identity (certificate CN) from the call's auth context.
"""
from __future__ import annotations

import grpc

from .certs import TlsConfig


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """Server side of mutual TLS: present our certificate, demand one signed by the job CA."""
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca_cert,
                                       require_client_auth=True)


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Client side of mutual TLS: trust only the job CA, present our certificate."""
    return grpc.ssl_channel_credentials(root_certificates=tls.ca_cert, private_key=tls.key,
                                        certificate_chain=tls.cert)


def target_name_options(receiver: str) -> list[tuple[str, str]]:
    """Channel options making the client verify that the server certificate is ``receiver``'s."""
    return [("grpc.ssl_target_name_override", receiver)]


def peer_identity(context: grpc.ServicerContext) -> str | None:
    """The CN of the client certificate of this call, or ``None`` without TLS / client certificate."""
    auth = context.auth_context() or {}
    names = auth.get("x509_common_name") or []
    if not names:
        return None
    name = names[0]
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
