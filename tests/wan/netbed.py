"""A WAN test bed: each party on its own network host (a Linux network namespace), made and torn down here.

Layout of one bed named ``NAME`` (unique per process and bed, e.g. ``sfwan4711x0``)::

    NAME-0 (party 0)   eth0 10.77.0.10 --veth-- p0 \\
    NAME-1 (party 1)   eth0 10.77.0.11 --veth-- p1  +- br0 in NAME-r (router): 10.77.0.1, relay aliases
    ...                                             /   10.77.0.130+i, the delaying relay (relay.py)

* Names: party ``P`` is ``P.wan.test``. Each namespace has its own ``/etc/netns/NS/hosts`` (``ip netns
  exec`` bind-mounts it over ``/etc/hosts``) in which every *peer's* name resolves to the relay's
  alias of that peer, and its own name to its own address; so every party-to-party byte crosses the
  relay, which holds it ``delay`` seconds (40 ms each way by default; netem is not in this kernel).
* Bandwidth: ``tc qdisc ... tbf`` on both ends of every party's veth (egress), i.e. ``rate_mbit`` up
  and down per party.
* Outages: :meth:`NetBed.link` sets the router end of a party's veth down / up (``ip link set``).
  Stalls: :meth:`NetBed.pause` / :meth:`NetBed.resume` hold every byte in the relay;
  :meth:`NetBed.freeze` black-holes one party's connections at once (bytes in flight are lost).
* Certificates: :meth:`NetBed.adopt_job` copies a job file onto the bed: addresses become host names,
  each party listens on ``0.0.0.0:PORT`` in its namespace, and a fresh CA issues each party a
  certificate whose SANs hold its party id and its host name.

Teardown (:meth:`NetBed.down`, also on ``with`` exit) kills what runs in the namespaces, deletes
them (which deletes the veths) and their ``/etc/netns`` folders; :func:`sweep` removes what beds of
processes that no longer exist left behind (a killed test run). Needs root and ``ip``/``tc``
(:func:`unavailable` says why not).

For users::

    python -m tests.wan.netbed run JOB.yaml [--delay-ms 40] [--rate-mbit 100] [--flap PARTY:AT_S:FOR_S]
    python -m tests.wan.netbed sweep
"""
from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

PREFIX = "sfwan"
SUBNET = "10.77.0"
DOMAIN = "wan.test"
NETNS_ETC = Path("/etc/netns")
WAN_DELAY_S = 0.040  # one way
WAN_RATE_MBIT = 100.0
_count = itertools.count()


def unavailable() -> str | None:
    """Why no bed can be made on this machine (not root, no ``ip``/``tc``, no namespaces), or None."""
    if os.geteuid() != 0:
        return "the WAN test bed needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the WAN test bed needs the {tool!r} command (iproute2)"
    probe = f"{PREFIX}{os.getpid()}xprobe"  # swept like a bed if this process dies before deleting it
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _pid_of(name: str) -> int | None:
    """The creating process id in a bed name ``sfwan<pid>x<n>...``."""
    digits = name[len(PREFIX):].split("x", 1)[0]
    return int(digits) if digits.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_ns(ns: str) -> None:
    r = _ip("netns", "pids", ns, check=False)
    for pid in r.stdout.split():  # processes left in the namespace: ours (a bed's parties, its relay)
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def sweep() -> list[str]:
    """Delete namespaces and ``/etc/netns`` folders of beds whose creating process is gone; return them."""
    names = {line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()}
    if NETNS_ETC.is_dir():
        names |= {p.name for p in NETNS_ETC.iterdir()}
    stale = sorted(n for n in names if n.startswith(PREFIX) and (pid := _pid_of(n)) is not None and not _alive(pid))
    for ns in stale:
        _remove_ns(ns)
    return stale


class NetBed:
    """One WAN bed for ``parties`` (ids, in job order). See the module docstring.

    Args:
        parties: party ids; party ``i`` gets namespace ``NAME-i`` and address ``10.77.0.(10+i)``.
        delay: seconds the relay holds each chunk, each way (0: no added latency).
        rate_mbit: tbf rate of each party's link, each direction (None: unlimited).
        port: the port every party listens on in its namespace.
    """

    def __init__(self, parties: list[str], *, delay: float = WAN_DELAY_S, rate_mbit: float | None = WAN_RATE_MBIT,
                 port: int = 50051):
        if len(parties) > 100:
            raise ValueError("at most 100 parties per bed")
        self.parties = list(parties)
        self.delay, self.rate_mbit, self.port = float(delay), rate_mbit, int(port)
        self.name = f"{PREFIX}{os.getpid()}x{next(_count)}"
        self.router = f"{self.name}-r"
        self.relay: subprocess.Popen | None = None
        self._relay_lock = threading.Lock()
        self._made: list[str] = []

    # ------------------------------------------------------------------ names
    def ns(self, party: str) -> str:
        return f"{self.name}-{self.parties.index(party)}"

    def ip(self, party: str) -> str:
        return f"{SUBNET}.{10 + self.parties.index(party)}"

    def alias(self, party: str) -> str:
        """The relay's address for ``party``: what the other parties' hosts files map its name to."""
        return f"{SUBNET}.{130 + self.parties.index(party)}"

    @staticmethod
    def hostname(party: str) -> str:
        return f"{party}.{DOMAIN}"

    def address(self, party: str) -> str:
        return f"{self.hostname(party)}:{self.port}"

    # ------------------------------------------------------------------ up / down
    def up(self) -> "NetBed":
        sweep()
        try:
            self._make_router()
            for i, party in enumerate(self.parties):
                self._make_party(i, party)
            self._start_relay()
        except BaseException:
            self.down()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _make_router(self) -> None:
        r = self.router
        self._add_ns(r)
        _ip("-n", r, "link", "add", "br0", "type", "bridge")
        _ip("-n", r, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
        for party in self.parties:
            _ip("-n", r, "addr", "add", f"{self.alias(party)}/24", "dev", "br0")
        _ip("-n", r, "link", "set", "br0", "up")

    def _make_party(self, i: int, party: str) -> None:
        ns, r = self.ns(party), self.router
        self._add_ns(ns)
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", r)
        _ip("-n", ns, "addr", "add", f"{self.ip(party)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", r, "link", "set", f"p{i}", "master", "br0")
        _ip("-n", r, "link", "set", f"p{i}", "up")
        if self.rate_mbit:
            for where, dev in ((ns, "eth0"), (r, f"p{i}")):
                # burst >= rate / HZ and a few MTUs; latency bounds the queue (~ the bandwidth-delay product)
                tc = subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                                     "rate", f"{self.rate_mbit}mbit", "burst", "256kb", "latency", "100ms"],
                                    capture_output=True, text=True)
                if tc.returncode:
                    raise RuntimeError(f"tc tbf on {dev} in {where}: {tc.stderr.strip()}")
        hosts = ["127.0.0.1 localhost", "::1 localhost"]
        hosts += [f"{self.ip(p) if p == party else self.alias(p)} {self.hostname(p)}" for p in self.parties]
        (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        (NETNS_ETC / ns / "hosts").write_text("\n".join(hosts) + "\n")

    def _start_relay(self) -> None:
        routes = [f"{self.alias(p)}:{self.port}={self.ip(p)}:{self.port}" for p in self.parties]
        self.relay = subprocess.Popen(
            ["ip", "netns", "exec", self.router, sys.executable, str(Path(__file__).with_name("relay.py")),
             "--delay", str(self.delay), *routes], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        line = self.relay.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the relay did not start: {line!r}")

    def down(self) -> None:
        """Stop the relay and everything in the bed's namespaces; delete them. Idempotent."""
        if self.relay is not None and self.relay.poll() is None:
            self.relay.kill()
            self.relay.wait()
        for ns in reversed(self._made):
            _remove_ns(ns)
        self._made.clear()

    def __enter__(self) -> "NetBed":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ------------------------------------------------------------------ conditions
    def link(self, party: str, up: bool) -> None:
        """Set ``party``'s link (the router end of its veth) up or down: an outage of that host."""
        _ip("-n", self.router, "link", "set", f"p{self.parties.index(party)}", "up" if up else "down")

    def _relay_cmd(self, cmd: str) -> None:
        with self._relay_lock:
            self.relay.stdin.write(cmd + "\n")
            self.relay.stdin.flush()
            answer = self.relay.stdout.readline().strip()
        if answer != f"ok {cmd}":
            raise RuntimeError(f"relay: {cmd!r} -> {answer!r}")

    def pause(self) -> None:
        """Stall: the relay holds every byte (nothing lost) until :meth:`resume`."""
        self._relay_cmd("pause")

    def resume(self) -> None:
        self._relay_cmd("resume")

    def freeze(self, party: str) -> None:
        """Black-hole ``party``'s connections in the relay now (bytes in flight are lost)."""
        self._relay_cmd(f"freeze {self.ip(party)}")

    def thaw(self, party: str) -> None:
        self._relay_cmd(f"thaw {self.ip(party)}")

    def set_delay(self, seconds: float, party: str | None = None) -> None:
        """Change the relay's delay each way: for every connection, or (``party``) for that party's only."""
        self._relay_cmd(f"delay {float(seconds)}" + (f" {self.ip(party)}" if party else ""))

    def cut(self, party: str) -> None:
        """Cut ``party`` off for good: its bytes in flight are lost and its link goes down."""
        self.freeze(party)
        self.link(party, False)

    # ------------------------------------------------------------------ processes and jobs
    def command(self, party: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(party), *argv]

    def popen(self, party: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` on ``party``'s host (its namespace; its own process group)."""
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(party, argv), **kw)

    def start_party(self, job: Path, party: str, *, log_level: str = "INFO") -> subprocess.Popen:
        """``secureflhv party JOB --party PARTY`` on ``party``'s host; stdout+stderr as text lines."""
        # the checkout these tests belong to, whatever the working directory and the installed copy
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path,
                   GRPC_VERBOSITY=os.environ.get("GRPC_VERBOSITY", "ERROR"))
        return self.popen(party, [sys.executable, "-m", "secureflhv", "party", str(job), "--party", party,
                                  "--log-level", log_level], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1, env=env, cwd=str(Path(job).parent))

    def adopt_job(self, job: Path, work: Path) -> Path:
        """A copy of ``job`` for this bed in ``work``: host-name addresses, listen on ``0.0.0.0:port``, and
        certificates (new CA in ``work/certs``) with SANs party id + host name. Data paths are made
        absolute; the output folder is ``work/<output_dir>``. Returns the new job file."""
        from secureflhv.transport.certs import generate_certificates

        job, work = Path(job).resolve(), Path(work).resolve()
        doc = yaml.safe_load(job.read_text())
        ids = [p["id"] for p in doc["parties"]]
        if sorted(ids) != sorted(self.parties):
            raise ValueError(f"job parties {ids} != bed parties {self.parties}")
        work.mkdir(parents=True, exist_ok=True)
        generate_certificates(work / "certs", ids, hostnames={p: [self.hostname(p)] for p in ids}, overwrite=True)
        for p in doc["parties"]:
            p.update(address=self.address(p["id"]), listen=f"0.0.0.0:{self.port}", cert=f"certs/{p['id']}.pem",
                     key=f"certs/{p['id']}.key")
            if "data" in p and "path" in p["data"]:
                p["data"]["path"] = str((job.parent / p["data"]["path"]).resolve())
        doc.setdefault("security", {}).update(ca="certs/ca.pem")
        doc["security"].pop("insecure", None)
        out = work / "job.yaml"
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
        return out


# ---------------------------------------------------------------------------------- for users
def _pump(party: str, proc: subprocess.Popen, lines: list[str]) -> None:
    for line in proc.stdout:
        lines.append(line)
        print(f"[{party}] {line}", end="", flush=True)


def run_job(job: Path, work: Path, *, delay: float, rate_mbit: float | None, flaps=(), timeout: float = 3600) -> int:
    """Run every party of ``job`` on a fresh bed (see :class:`NetBed`); return the worst exit code."""
    ids = [p["id"] for p in yaml.safe_load(Path(job).read_text())["parties"]]
    with NetBed(ids, delay=delay, rate_mbit=rate_mbit) as bed:
        wan_job = bed.adopt_job(job, work)
        print(f"bed {bed.name}: {', '.join(f'{p}={bed.hostname(p)} ({bed.ip(p)})' for p in ids)}; "
              f"{delay * 1000:.0f} ms each way, {rate_mbit or 'unlimited'} Mbit/s; job {wan_job}", flush=True)
        procs = {p: bed.start_party(wan_job, p) for p in ids}
        pumps = [threading.Thread(target=_pump, args=(p, pr, []), daemon=True) for p, pr in procs.items()]
        for t in pumps:
            t.start()
        start = time.monotonic()
        for party, at, seconds in flaps:
            time.sleep(max(0.0, start + at - time.monotonic()))
            print(f"--- link of {party} down for {seconds:.0f}s", flush=True)
            bed.link(party, False)
            time.sleep(seconds)
            bed.link(party, True)
            print(f"--- link of {party} up", flush=True)
        try:
            codes = [pr.wait(timeout=max(1.0, start + timeout - time.monotonic())) for pr in procs.values()]
        finally:
            for pr in procs.values():
                if pr.poll() is None:
                    os.killpg(pr.pid, signal.SIGKILL)
        for t in pumps:
            t.join(2)
    return max(codes)


def _flap(text: str) -> tuple[str, float, float]:
    party, at, seconds = text.rsplit(":", 2)
    return party, float(at), float(seconds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.wan.netbed", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run every party of a job, each on its own host of a fresh bed")
    run.add_argument("job", type=Path)
    run.add_argument("--work", type=Path, default=Path("wan-run"), help="folder for the bed's job, certs, outputs")
    run.add_argument("--delay-ms", type=float, default=WAN_DELAY_S * 1000, help="added latency, each way")
    run.add_argument("--rate-mbit", type=float, default=WAN_RATE_MBIT, help="link rate per party (0: unlimited)")
    run.add_argument("--flap", type=_flap, action="append", default=[], metavar="PARTY:AT_S:FOR_S",
                     help="take PARTY's link down AT_S seconds after the start, for FOR_S seconds")
    run.add_argument("--timeout", type=float, default=3600)
    sub.add_parser("sweep", help="remove what killed runs left behind")
    args = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(why, file=sys.stderr)
        return 2
    if args.cmd == "sweep":
        print("\n".join(sweep()) or "nothing to remove")
        return 0
    return run_job(args.job, args.work, delay=args.delay_ms / 1000, rate_mbit=args.rate_mbit or None,
                   flaps=args.flap, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
