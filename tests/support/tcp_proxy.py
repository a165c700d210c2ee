"""A TCP proxy on 127.0.0.1 in front of a server (PostgreSQL), for a store outage that leaves
the server running for every other test: :meth:`TcpProxy.cut` closes every connection through
it and refuses new ones (as a stopped server does), :meth:`TcpProxy.restore` accepts again on
the same port."""

from __future__ import annotations

import socket
import threading
from typing import List, Optional, Tuple

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards connections to ``127.0.0.1:port`` to ``target`` (one thread per direction).

    Args:
        target: ``(host, port)`` of the server.
    """

    __slots__ = ("_conns", "_listener", "_lock", "port", "target")

    def __init__(self, target: Tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._lock = threading.Lock()
        self._conns: List[socket.socket] = []
        self._listener: Optional[socket.socket] = None

    def start(self) -> "TcpProxy":
        """Listen (a free port the first time, the same port after a cut)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        """Close every connection and stop listening (new connections are refused)."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self.start()

    def close(self) -> None:
        """Cut, for good."""
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by a cut
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for conn in (source, sink):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
