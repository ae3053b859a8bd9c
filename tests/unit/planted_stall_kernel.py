"""A planted fault for tests/unit/test_kernel_watch.py: a kernel that stops answering after its handshake.

Started by a kernel spec as ``python planted_stall_kernel.py -f CONNECTION_FILE``, it binds the five
Jupyter sockets, echoes heartbeats, answers the first ``kernel_info_request`` (the client's start-up
handshake) and publishes idle statuses on iopub for the next 2 s, then answers nothing on shell or
control: the client's post-start ``kernel_info`` request is never answered, as in the stall it plants.
"""

from __future__ import annotations

import json
import sys
import time

import zmq
from jupyter_client.session import Session


def main() -> None:
    info = json.loads(open(sys.argv[sys.argv.index("-f") + 1]).read())
    session = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"])
    ctx = zmq.Context()

    def bind(kind, name):
        sock = ctx.socket(kind)
        if info["transport"] == "ipc":
            sock.bind(f"ipc://{info['ip']}-{info[name]}")
        else:
            sock.bind(f"tcp://{info['ip']}:{info[name]}")
        return sock

    hb = bind(zmq.REP, "hb_port")
    shell = bind(zmq.ROUTER, "shell_port")
    control = bind(zmq.ROUTER, "control_port")
    stdin = bind(zmq.ROUTER, "stdin_port")
    iopub = bind(zmq.PUB, "iopub_port")
    poller = zmq.Poller()
    for sock in (hb, shell, control, stdin):
        poller.register(sock, zmq.POLLIN)
    answered_at = None
    while True:
        for sock, _ in poller.poll(100):
            if sock is hb:
                hb.send(hb.recv())
                continue
            idents, frames = session.feed_identities(sock.recv_multipart())
            msg = session.deserialize(frames)
            if sock is shell and msg["msg_type"] == "kernel_info_request" and answered_at is None:
                content = {
                    "status": "ok",
                    "protocol_version": "5.3",
                    "implementation": "planted-stall",
                    "implementation_version": "0",
                    "language_info": {"name": "python", "version": "3", "file_extension": ".py"},
                    "banner": "",
                }
                session.send(shell, "kernel_info_reply", content, parent=msg, ident=idents)
                answered_at = time.monotonic()
        if answered_at is not None and time.monotonic() - answered_at < 2.0:
            session.send(iopub, "status", {"execution_state": "idle"})


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the client's shutdown interrupts, then terminates it
        pass
