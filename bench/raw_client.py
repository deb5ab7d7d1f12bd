"""One kept-alive HTTP/1.1 connection over a raw socket (TCP_NODELAY),
the reply read into one preallocated buffer: the benchmarks' client, lean
enough that its own time stays out of what they measure."""
import socket
import time
import urllib.parse


class RawClient:
    """request() returns (status, reply body as a memoryview into the
    buffer, valid until the next request, seconds from the first byte
    sent to the last byte received)."""

    def __init__(self, url, reply_bytes):
        u = urllib.parse.urlparse(url)
        self.host = u.hostname
        self.sock = socket.create_connection((u.hostname, u.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(reply_bytes + (1 << 20))  # the body and room for the head
        self.view = memoryview(self.buf)

    def _recv(self, got, limit):
        n = self.sock.recv_into(self.view[got:limit], limit - got)
        if not n:
            raise RuntimeError("the server closed the connection")
        return got + n

    def request(self, path, body, ctype="application/octet-stream"):
        head = ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                % (path, self.host, ctype, len(body))).encode()
        t0 = time.perf_counter()
        self.sock.sendall(head)
        self.sock.sendall(body)
        got, end = 0, -1
        while end < 0:
            got = self._recv(got, len(self.buf))
            end = self.buf.find(b"\r\n\r\n", 0, got)
        text = bytes(self.buf[:end]).decode("latin-1")
        lengths = [ln.split(":", 1)[1] for ln in text.split("\r\n") if ln.lower().startswith("content-length:")]
        if not lengths:
            raise RuntimeError("a reply without Content-Length: %r" % text[:300])
        total = end + 4 + int(lengths[0])
        if total > len(self.buf):
            raise RuntimeError("a reply of %d bytes, past the client's buffer" % total)
        while got < total:
            got = self._recv(got, total)
        seconds = time.perf_counter() - t0
        return int(text.split(" ", 2)[1]), self.view[end + 4:total], seconds

    def close(self):
        self.sock.close()
