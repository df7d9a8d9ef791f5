"""The event plane's broker of a local Dynamo deployment: a ZMQ XSUB/XPUB
forwarder on loopback (serving.dynamo starts it).

Dynamo's workers publish KV and load events over ZMQ; without a broker each
publisher binds its own socket on 0.0.0.0 (hard-coded), with one
(DYN_ZMQ_BROKER_URL) every publisher and subscriber connects here instead.

Run by the Dynamo virtualenv's python, by path and isolated (`python -I
dynamo_broker.py XSUB_PORT XPUB_PORT`): it imports nothing of the project
and no Django, and pyzmq is in that virtualenv only, hence the import inside
main(). SIGTERM ends it (the default action)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import zmq

    xsub_port, xpub_port = (int(port) for port in argv)
    context = zmq.Context()
    publishers = context.socket(zmq.XSUB)
    publishers.bind(f"tcp://127.0.0.1:{xsub_port}")
    subscribers = context.socket(zmq.XPUB)
    subscribers.bind(f"tcp://127.0.0.1:{xpub_port}")
    zmq.proxy(publishers, subscribers)


if __name__ == "__main__":
    main(sys.argv[1:])
