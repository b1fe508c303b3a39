"""job.max_message_mb: validated with a named-field error, and the party's transport enforces it."""
import socket

import pytest

from secureflhv.runtime.job.job_file import JobConfigError, parse_job_file
from secureflhv.runtime.process.party import build_transport
from secureflhv.transport import DEFAULT_MAX_PAYLOAD_BYTES, MessageRejected
from secureflhv.transport.grpc_transport import GrpcTransport


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(**section) -> dict:
    return {
        "job": {"id": "j1", "algorithm": "vertical_lr", **section},
        "security": {"insecure": True},
        "parties": [
            {"id": "guest", "role": "guest", "address": f"127.0.0.1:{free_port()}",
             "data": {"path": "g.csv", "label_column": "y"}},
            {"id": "host-1", "role": "host", "address": f"127.0.0.1:{free_port()}", "data": {"path": "h.csv"}},
        ],
    }


def test_default_is_the_transport_default():
    cfg = parse_job_file(job())
    assert cfg.job.max_message_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 256 * 2 ** 20


@pytest.mark.parametrize("bad", [0, -1, "lots", 10 ** 9])
def test_bad_value_is_named(bad):
    with pytest.raises(JobConfigError, match=r"job\.max_message_mb"):
        parse_job_file(job(max_message_mb=bad))


def test_party_transport_refuses_a_message_over_the_job_limit():
    cfg = parse_job_file(job(max_message_mb=0.5, deadline_s=5))
    guest = build_transport(cfg, cfg.party("guest"), insecure=True)
    host = GrpcTransport("host-1", "j1", "127.0.0.1:0", {"guest": cfg.party("guest").address}, insecure=True,
                         deadline=5)
    try:
        assert guest.max_payload_bytes == 512 * 1024
        host.send("guest", "t", b"a" * (512 * 1024), round=1)  # exactly the limit: accepted
        assert guest.recv("host-1", "t", round=1) == b"a" * (512 * 1024)
        with pytest.raises(MessageRejected, match=r"exceeds this party's limit of 524288 bytes.*job\.max_message_mb"):
            host.send("guest", "t", b"a" * (512 * 1024 + 1), round=2)
        assert guest.rejected[-1][0].size == 512 * 1024 + 1
    finally:
        host.close(grace=0)
        guest.close(grace=0)
