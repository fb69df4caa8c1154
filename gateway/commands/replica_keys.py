"""`kvgate replica-keys`: a new CURVE key pair for the replica sync channel.

Prints `secret-key=…` and `public-key=…` lines (the files of `KVGATE_REPLICA_CURVE_KEYS_DIR`;
`kubectl create secret generic kvgate-replica-keys --from-env-file=…` reads them as they
are), or with `--kubernetes` a Secret manifest to pipe into `kubectl apply -f -`. The
secret key is printed once, to stdout, and never stored.
"""

from __future__ import annotations

import argparse
import re
import sys

import yaml

from gateway.control.replication.keys import PUBLIC_FILE, SECRET_FILE, new_key_pair

SECRET_NAME = "kvgate-replica-keys"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubernetes", action="store_true",
        help=f"print a Secret manifest (default name {SECRET_NAME}) instead of key=value lines",
    )  # fmt: skip
    parser.add_argument("--name", default=SECRET_NAME, help="the Secret's name")
    parser.add_argument("--namespace", default="kvgate", help="the Secret's namespace")


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--name", args.name), ("--namespace", args.namespace)):
        if not _NAME.fullmatch(value):
            print(f"kvgate replica-keys: {flag}={value!r} is not a Kubernetes name",
                  file=sys.stderr)  # fmt: skip
            return 2
    secret, public = new_key_pair()
    if args.kubernetes:
        print(secret_manifest(secret, public, name=args.name, namespace=args.namespace), end="")
    else:
        print(f"{SECRET_FILE}={secret}\n{PUBLIC_FILE}={public}")
    return 0


def secret_manifest(secret: str, public: str, *, name: str, namespace: str) -> str:
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "kvgate"},
        },
        "type": "Opaque",
        "stringData": {SECRET_FILE: secret, PUBLIC_FILE: public},
    }
    return str(yaml.safe_dump(manifest, sort_keys=False))
