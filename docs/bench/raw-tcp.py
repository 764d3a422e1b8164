#!/usr/bin/env python3
# Raw TCP over a link, memory to memory, timed at the receiver: the "raw TCP" bound of
# docs/bench/tune-cells.sh and of the third-party benchmark (crates/dmover/tests/
# tpc_bench.rs). Unlike `iperf3 -n`, whose clock stops when the sender has written
# its bytes (seconds early at a long RTT), the time here ends when the receiver holds
# the last byte. Run the receiver first (it prints "ready"), then the sender; the
# bytes' time is the receiver's last line minus the sender's (same host clock:
# monotonic time, the two ends in network namespaces of one machine).
#
# Usage: `r HOST PORT N` receives N connections until EOF and
# prints the monotonic time the last byte arrived; `s HOST PORT N BYTES CC` sends
# BYTES over N connections and prints the monotonic time it started.
import socket, sys, threading, time
role, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "r":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((host, port)); l.listen(64)
    print("ready", flush=True)
    ends = []
    def drain(c):
        buf = bytearray(4 << 20)
        while c.recv_into(buf):
            pass
        ends.append(time.monotonic())
    ts = []
    for _ in range(n):
        c, _ = l.accept()
        t = threading.Thread(target=drain, args=(c,)); t.start(); ts.append(t)
    for t in ts:
        t.join()
    print(f"{max(ends):.6f}", flush=True)
else:
    total, cc = int(sys.argv[5]), sys.argv[6].encode()
    start = time.monotonic()
    blob = memoryview(bytes(4 << 20))
    def send(k):
        c = socket.socket()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
        c.connect((host, port))
        left = total // n + (1 if k < total % n else 0)
        while left:
            m = min(left, len(blob))
            c.sendall(blob[:m]); left -= m
        c.shutdown(socket.SHUT_WR)
        c.recv(1)
        c.close()
    ts = [threading.Thread(target=send, args=(k,)) for k in range(n)]
    for t in ts: t.start()
    for t in ts: t.join()
    print(f"{start:.6f}", flush=True)
