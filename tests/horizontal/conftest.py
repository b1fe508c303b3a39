"""Fixtures of the horizontal tests: one set of certificates per test session (see secagg_harness)."""
import pytest

import secagg_harness
from secureflhv.transport.certs import generate_certificates


@pytest.fixture(scope="session", autouse=True)
def secagg_cert_dir(tmp_path_factory):
    """A job CA and certificates for every party id the secagg tests use, generated once per session;
    :func:`secagg_harness.run_round` runs authenticated with them."""
    path = tmp_path_factory.mktemp("secagg-certs")
    generate_certificates(path, secagg_harness.CERT_PARTIES)
    secagg_harness.CERT_DIR = path
    return path
