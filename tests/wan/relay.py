"""A delaying TCP relay: WAN latency and stalls on the path between parties (netem is not available here).

Runs in the bed's router namespace (:mod:`tests.wan.netbed` starts it there). For every route
``LISTEN_IP:PORT=TARGET_IP:PORT`` it accepts connections on the listen side and opens one to the
target, then forwards bytes both ways, each chunk held ``delay`` seconds after it was read (a
pipeline delay: chunks keep their order and are not delayed one after another, so throughput is
not cut by the delay; at most ``--window`` bytes per direction are held, which keeps TCP's back-pressure).
So a party that connects to a peer's name (resolved to the relay's alias of that peer) sees
``delay`` seconds each way on top of the links' own (tbf-limited) transfer time.

Control: one command per line on stdin, answered with ``ok <command>`` on stdout:

* ``pause`` / ``resume`` - stop forwarding on every connection (data is held, not lost: a stall);
* ``freeze IP`` / ``thaw IP`` - black-hole every connection from or to ``IP``: bytes read are
  dropped, nothing is forwarded, sockets stay open (what a cut cable looks like to TCP); new
  connections from or to ``IP`` are held the same way;
* ``delay SECONDS [IP]`` - change the delay for chunks read from now on (with ``IP``: of connections
  from or to ``IP`` only, e.g. one far-away party; the larger of its and the default applies).

Prints ``ready`` once every route listens. Not part of the package: test tooling only.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time

CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 3.0  # an unreachable target (its link is down) closes the client side after this


class Relay:
    def __init__(self, routes: list[tuple[str, int, str, int]], delay: float, window: int):
        self.routes = routes
        self.delay = float(delay)
        self.window = int(window)
        self.running = asyncio.Event()
        self.running.set()
        self.frozen: set[str] = set()
        self.delays: dict[str, float] = {}  # per-IP delay (a far-away party)

    def _delay(self, ips: tuple[str, str]) -> float:
        return max([self.delay] + [self.delays[ip] for ip in ips if ip in self.delays])

    def _blocked(self, *ips: str) -> bool:
        return any(ip in self.frozen for ip in ips)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ips: tuple[str, str]) -> None:
        """Read chunks into a bounded queue stamped with their due time; a second task writes them when due."""
        queue: asyncio.Queue = asyncio.Queue(maxsize=max(1, self.window // CHUNK))

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.running.wait()
                if self._blocked(*ips):
                    continue  # black hole: the bytes are gone
                writer.write(data)
                await writer.drain()
            if not self._blocked(*ips) and writer.can_write_eof():
                writer.write_eof()

        task = asyncio.create_task(send())
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if self._blocked(*ips):
                    continue
                await queue.put((time.monotonic() + self._delay(ips), data))
            await queue.put((0.0, None))  # EOF forwarded after the data (half-close kept)
            await task
        except (ConnectionError, OSError):
            task.cancel()
            writer.close()

    async def _serve(self, target: tuple[str, int], client_r, client_w) -> None:
        client_ip = client_w.get_extra_info("peername")[0]
        ips = (client_ip, target[0])
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*target), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            if self._blocked(*ips):  # a cut cable: the client sees nothing, not a reset
                await asyncio.sleep(3600)
            client_w.close()
            return
        await asyncio.gather(self._pump(client_r, up_w, ips), self._pump(up_r, client_w, ips),
                             return_exceptions=True)
        for w in (up_w, client_w):
            w.close()

    async def _control(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd, *args = line.split() or [""]
            if cmd == "pause":
                self.running.clear()
            elif cmd == "resume":
                self.running.set()
            elif cmd == "freeze" and args:
                self.frozen.add(args[0])
            elif cmd == "thaw" and args:
                self.frozen.discard(args[0])
            elif cmd == "delay" and len(args) == 2:
                self.delays[args[1]] = float(args[0])
            elif cmd == "delay" and args:
                self.delay = float(args[0])
            else:
                print(f"error unknown command {line.strip()!r}", flush=True)
                continue
            print(f"ok {line.strip()}", flush=True)

    async def main(self) -> None:
        servers = []
        for lip, lport, tip, tport in self.routes:
            servers.append(await asyncio.start_server(
                lambda r, w, t=(tip, tport): self._serve(t, r, w), lip, lport, reuse_address=True))
        print("ready", flush=True)
        await self._control()  # stdin closed: the bed is going away
        for s in servers:
            s.close()


def _route(text: str) -> tuple[str, int, str, int]:
    listen, _, target = text.partition("=")
    lip, _, lport = listen.rpartition(":")
    tip, _, tport = target.rpartition(":")
    return lip, int(lport), tip, int(tport)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", type=float, default=0.04, help="seconds each chunk is held, each way")
    ap.add_argument("--window", type=int, default=4 << 20, help="bytes held per direction at most")
    ap.add_argument("route", nargs="+", type=_route, help="LISTEN_IP:PORT=TARGET_IP:PORT")
    args = ap.parse_args(argv)
    asyncio.run(Relay(args.route, args.delay, args.window).main())


if __name__ == "__main__":
    main()
