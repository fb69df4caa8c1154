"""`kvgate serve`: the gateway service."""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.app import Attach
from gateway.http.protocol import bounded_protocol
from gateway.observability.logs import configure_logging
from gateway.routing.router import build_policies
from gateway.runtime import tune_gc
from gateway.settings import (
    DISCOVERIES,
    POLICIES,
    Settings,
    read_config_file,
    setting_declaration,
    setting_groups,
    unread_variables,
)

logger = logging.getLogger(__name__)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pods", type=Path, metavar="FILE", help="static discovery file, JSON or TOML "
        "(env KVGATE_PODS_FILE); reloaded when it changes or on SIGHUP",
    )  # fmt: skip
    parser.add_argument(
        "--discovery", choices=DISCOVERIES, help="where pods come from: the --pods file "
        "(static, the default), labelled pods from the Kubernetes API (kubernetes: see "
        "KVGATE_K8S_NAMESPACES, KVGATE_K8S_LABEL_SELECTOR) or an InferencePool's pods "
        "(inference-pool: see KVGATE_INFERENCE_POOL) (env KVGATE_DISCOVERY)",
    )  # fmt: skip
    parser.add_argument("--host", help=_flag_help("host"))
    parser.add_argument("--port", type=int, help=_flag_help("port"))
    parser.add_argument(
        "--policy",
        help="default routing policy (env KVGATE_DEFAULT_POLICY): one of "
        + ", ".join(POLICIES)
        + " or a profile of the routing config",
    )
    parser.add_argument(
        "--routing-config", type=Path, metavar="FILE", help="routing profiles, TOML or YAML, "
        "laid over the built-in policies (env KVGATE_ROUTING_CONFIG; docs/routing.md)",
    )  # fmt: skip
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="settings file, TOML or YAML: the "
        "environment's names as keys (KVGATE_PORT = 8080); the environment overrides it",
    )  # fmt: skip
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    every = [
        f"{declaration.variable} ({declaration.default_text(default)}"
        + "".join(f"; or {alias.variable}" for alias in declaration.aliases)
        + ")"
        for entries in setting_groups().values()
        for declaration, default in entries
    ]
    parser.epilog = (
        "Every setting, read from the environment or a --config file, with its default "
        "(`kvgate settings` adds each one's meaning and current value; AIBrix's names are "
        "read too): " + ", ".join(every)
    )


def _flag_help(name: str) -> str:
    """A flag's help from its setting's declaration: meaning, variable and default."""
    declaration, default = setting_declaration(name)
    meaning = declaration.meaning.split(" (`--")[0]
    return f"{meaning} (env {declaration.variable}, {declaration.default_text(default)})"


def run(args: argparse.Namespace) -> int:
    return run_gateway(args, "serve")


def run_gateway(args: argparse.Namespace, command: str, attach: Attach | None = None) -> int:
    """`kvgate COMMAND`: the gateway app from the environment, --config and the flags of
    `configure_parser`, served by uvicorn (with `attach` started beside it)."""
    configure_logging(args.log_level, "text")  # until the settings name the format
    overrides = {
        "pods_file": args.pods,
        "discovery": args.discovery,
        "host": args.host,
        "port": args.port,
        "default_policy": args.policy,
        "routing_config": args.routing_config,
    }
    try:
        env: dict[str, str] = dict(os.environ)
        if args.config is not None:
            env = {**read_config_file(args.config), **env}
        settings = Settings.load(env, overrides)
        configure_logging(args.log_level, settings.log_format)
        for name in unread_variables(env):
            logger.warning(
                "%s is set but kvgate reads no such setting (a typo, or an AIBrix setting "
                "kvgate has no counterpart for; docs/configuration.md lists every setting)",
                name,
            )
        # A bad routing config (unknown plugin, bad parameter) stops start-up naming it.
        build_policies(settings, random.Random())
        from gateway.app import create_app

        app = create_app(settings, attach=attach)
    except ConfigError as exc:
        print(f"kvgate {command}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    tune_gc(settings.gc_gen0_threshold)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        access_log=False,  # kvgate.access writes one line per request instead
        log_config=None,  # uvicorn's loggers propagate to ours (same format, JSON included)
        timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s),
        timeout_keep_alive=30,
        # The client address comes from forwarding headers only as KVGATE_TRUSTED_PROXIES
        # says (gateway/http/client_address.py); uvicorn's own would trust 127.0.0.1's.
        proxy_headers=False,
        http=bounded_protocol(
            max_header_bytes=settings.max_header_bytes, header_timeout_s=settings.header_timeout_s
        ),
    )
    # Bind before the lifespan starts: a taken port fails at once, before the gateway
    # subscribes to every engine and logs that it is ready.
    ports = [settings.port] + ([settings.admin_port] if settings.admin_port else [])
    listeners: list[socket.socket] = []
    try:
        for port in ports:  # the API's, then /metrics and /admin's (KVGATE_ADMIN_PORT)
            listeners.append(_listen(settings.host, port))
    except OSError as exc:
        for listener in listeners:
            listener.close()
        print(f"kvgate {command}: cannot listen on {settings.host}:{port}: {exc.strerror}",
              file=sys.stderr)  # fmt: skip
        return 1
    server = uvicorn.Server(config)
    try:
        server.run(sockets=listeners)
    finally:
        for listener in listeners:
            listener.close()
    return 0 if server.started else 1


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.set_inheritable(True)
    except OSError:
        listener.close()
        raise
    return listener
