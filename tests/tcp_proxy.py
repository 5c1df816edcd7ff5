"""A TCP proxy in front of a real service, to make it slow on purpose.

It forwards bytes both ways between its own port and the service's, and can hold a
connection (accepted, but nothing forwarded) until the test lets it go: the service looks
slow to answer, while every byte that does flow is the real service's.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class TcpProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.connections = 0
        # Called with the connection's number (1 for the first) before it is forwarded.
        self.before_forwarding: Callable[[int], None] | None = None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        # Cleared by ``freeze``: every connection stays open and nothing is forwarded.
        self._flowing = threading.Event()
        self._flowing.set()
        # Chunks that came while frozen (held until ``thaw``): a client waits on them.
        self.held = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        """Forward nothing more, on any connection, and close none: the service looks hung
        mid-answer (its host still acknowledges every packet)."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            # Shut down first: a pump's thread blocked in recv on it keeps the connection
            # open past a bare close, and the service would never see it end.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _keep(self, sock: socket.socket) -> bool:
        """Registers a connection's socket to close with the proxy; one opened while the
        proxy closed is closed at once (False)."""
        with self._lock:
            if not self._closed.is_set():
                self._sockets.append(sock)
                return True
        sock.close()
        return False

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
            if not self._keep(client):
                return
            threading.Thread(target=self._serve, args=(client, number), daemon=True).start()

    def _serve(self, client: socket.socket, number: int) -> None:
        try:
            if self.before_forwarding is not None:
                # Raising OSError hangs up on the client: the service looks down.
                self.before_forwarding(number)
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        if not self._keep(upstream):
            client.close()
            return
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self._flowing.is_set():
                    with self._lock:
                        self.held += 1
                    self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
