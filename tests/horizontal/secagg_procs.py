"""Party processes for the multi-process secure-aggregation test (spawn start method; not a test module)."""
from __future__ import annotations

import time



def _log_to_stderr(pid):
    import logging
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {pid} %(name)s: %(message)s")


def _transport(pid, addrs, cert_dir):
    from secureflhv.transport.certs import load_party_credentials
    from secureflhv.transport.grpc_transport import GrpcTransport
    tls = load_party_credentials(cert_dir, pid) if cert_dir else None
    return GrpcTransport(pid, "job-secagg-mp", addrs[pid], addrs, tls=tls, insecure=tls is None, deadline=60)


def client_main(pid, addrs, cert_dir, cfg_kw, round_id, participants, x, w, stall_stage, queue, unclipped=False):
    """One client's round; ``stall_stage``: hang before sending that stage; ``unclipped``: skip clipping
    (quantise with a clip 10^4 times the job's, a dishonest client)."""
    from secureflhv.crypto.quantise import QuantParams, quantise, rounding_rng
    from secureflhv.secagg import AggregationConfig, make_aggregation
    _log_to_stderr(pid)
    cfg = AggregationConfig(**cfg_kw)
    tr = _transport(pid, addrs, cert_dir)
    base, _ = make_aggregation(cfg)

    class Client(base):
        def _on_stage(self, stage):
            if stage == stall_stage:
                queue.put(("stalled", pid))
                time.sleep(600)  # the parent kills this process now

        def _encode(self, x, weight, qp, round_id):
            if not unclipped:
                return super()._encode(x, weight, qp, round_id)
            wide = QuantParams(qp.clip * 1e4, qp.scale, qp.max_weight, qp.k_bits)
            return quantise(x * 1e4, weight, wide, rounding_rng(None, round_id, self.party_id))[0]

    try:
        Client(tr, "server", cfg).submit(round_id, participants, x, w)
        queue.put(("client_done", pid))
    except Exception as exc:  # noqa: BLE001
        queue.put(("client_error", pid, repr(exc)))
    finally:
        tr.close()


def server_main(addrs, cert_dir, cfg_kw, round_ids, participants, dim, queue):
    from secureflhv.secagg import AggregationConfig, make_server
    _log_to_stderr("server")
    cfg = AggregationConfig(**cfg_kw)
    try:
        tr = _transport("server", addrs, cert_dir)
    except Exception as exc:  # noqa: BLE001 - e.g. the port was taken meanwhile
        queue.put(("server_error", repr(exc)))
        return
    server = make_server(tr, cfg)
    try:
        for rid in round_ids:
            t0 = time.perf_counter()
            res = server.aggregate(rid, participants, dim)
            queue.put(("result", rid, time.perf_counter() - t0, res.total, res.weight, res.survivors,
                       getattr(server, "last_timings", {})))
    except Exception as exc:  # noqa: BLE001
        queue.put(("server_error", repr(exc)))
    finally:
        tr.close()
