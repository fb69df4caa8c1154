"""`kvgate epp`: the gateway's routing as a Gateway API Inference Extension endpoint
picker (Envoy ext_proc over gRPC), with the same settings as `kvgate serve`; its HTTP
port serves /metrics, /health, /ready and /admin (and the proxy's own routes)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.commands import serve

DEFAULT_GRPC_PORT = 9002
"""The Inference Extension's picker port."""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    serve.configure_parser(parser)
    parser.add_argument(
        "--grpc-port", type=int, default=DEFAULT_GRPC_PORT, metavar="PORT",
        help=f"the ext_proc gRPC port (default {DEFAULT_GRPC_PORT}, the Inference Extension's)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-cert", type=Path, metavar="FILE",
        help="TLS certificate chain (PEM) of the gRPC port; with --grpc-key. Without both it "
        "serves plaintext",
    )  # fmt: skip
    parser.add_argument("--grpc-key", type=Path, metavar="FILE", help="its private key (PEM)")
    parser.add_argument(
        "--grpc-client-ca", type=Path, metavar="FILE",
        help="with --grpc-cert: accept only clients (the data plane) presenting a certificate "
        "this CA bundle (PEM) signed: mutual TLS",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if (args.grpc_cert is None) != (args.grpc_key is None):
        print("kvgate epp: --grpc-cert and --grpc-key go together", file=sys.stderr)
        return 2
    if args.grpc_client_ca is not None and args.grpc_cert is None:
        print("kvgate epp: --grpc-client-ca needs --grpc-cert and --grpc-key", file=sys.stderr)
        return 2
    for path in (args.grpc_cert, args.grpc_key, args.grpc_client_ca):
        if path is not None and not path.is_file():
            print(f"kvgate epp: {path}: no such file", file=sys.stderr)
            return 2
    from gateway.epp.server import EppConfig, EppService

    config = EppConfig(args.host, args.grpc_port, args.grpc_cert, args.grpc_key,
                       args.grpc_client_ca)  # fmt: skip
    service = EppService(config)
    return serve.run_gateway(args, "epp", service.start)
