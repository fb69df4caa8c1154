"""`kvgate serve`: the gateway service."""

from __future__ import annotations

import argparse

from gateway.not_ready import not_yet_available


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", metavar="FILE", help="static discovery file (pods.json)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")


def run(args: argparse.Namespace) -> int:
    return not_yet_available("serve")
