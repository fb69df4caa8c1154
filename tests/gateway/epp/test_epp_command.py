"""`kvgate epp` as deployed: a real process, TLS on its gRPC port (a self-signed
certificate, as the reference picker serves), a pick over it, /metrics on its HTTP port,
and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.epp.client import EnvoyClient, request_pick
from gateway.epp.server import EppConfig
from tests.conftest import StartEngine
from tests.gateway.conftest import pod_entry
from tests.gateway.epp.conftest import CHAT, StartPicker, chat
from tests.helpers import ROOT, eventually, free_ports, run_kvgate


def _self_signed(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_cert_without_key_is_refused() -> None:
    result = run_kvgate("epp", "--grpc-cert", "/nonexistent.crt")
    assert result.returncode == 2
    assert "--grpc-cert and --grpc-key go together" in result.stderr
    result = run_kvgate("epp", "--grpc-client-ca", "/nonexistent.pem")
    assert result.returncode == 2
    assert "--grpc-client-ca needs --grpc-cert and --grpc-key" in result.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for a certificate")
async def test_kvgate_epp_picks_over_tls_and_serves_metrics(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(name="e0")
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [pod_entry(engine)]}))
    cert, key = _self_signed(tmp_path)
    http_port, grpc_port = free_ports(2)
    with (tmp_path / "epp.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "epp", "--pods", str(pods), "--host",
            "127.0.0.1", "--port", str(http_port), "--grpc-port", str(grpc_port),
            "--grpc-cert", str(cert), "--grpc-key", str(key),
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    envoy = EnvoyClient(f"localhost:{grpc_port}", root_certificates=cert.read_bytes())
    try:
        channel = grpc.aio.secure_channel(
            f"localhost:{grpc_port}", grpc.ssl_channel_credentials(cert.read_bytes())
        )
        health = health_pb2_grpc.HealthStub(channel)

        async def serving() -> bool:
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

        await eventually(serving, within=60, what="kvgate epp SERVING over TLS")
        await channel.close()
        answers = await request_pick(envoy.stream(), CHAT, chat("hello"))
        assert answers[0].destination == engine.url.removeprefix("http://")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as client:
            page = (await client.get("/metrics")).text
        assert 'kvgate_epp_picks_total{result="picked"} 1.0' in page
    finally:
        await envoy.close()
        process.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal it handled once shut down, as under `kvgate serve`
        assert await asyncio.wait_for(process.wait(), 30) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in (tmp_path / "epp.log").read_text()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for certificates")
async def test_with_a_client_ca_only_a_data_plane_holding_its_certificate_picks(
    start_picker: StartPicker, tmp_path: Path
) -> None:
    """`--grpc-client-ca`: mutual TLS. A client without a certificate, or with one the CA
    did not sign, never completes the handshake; the data plane's certificate picks."""
    server_cert, server_key = _self_signed(tmp_path / "server")
    plane_cert, plane_key = _self_signed(tmp_path / "plane")  # self-signed: its own CA
    stranger_cert, stranger_key = _self_signed(tmp_path / "stranger")
    config = EppConfig("127.0.0.1", 0, server_cert, server_key, client_ca=plane_cert)
    picker = await start_picker(engines=1, config=config)
    target, roots = f"localhost:{picker.service.port}", server_cert.read_bytes()
    for pair in (None, (stranger_key.read_bytes(), stranger_cert.read_bytes())):
        refused = EnvoyClient(target, root_certificates=roots, client_pair=pair)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await asyncio.wait_for(request_pick(refused.stream(), CHAT, chat("hi")), 30)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await refused.close()
    plane = (plane_key.read_bytes(), plane_cert.read_bytes())
    envoy = EnvoyClient(target, root_certificates=roots, client_pair=plane)
    try:
        answers = await asyncio.wait_for(request_pick(envoy.stream(), CHAT, chat("hi")), 30)
        assert answers[0].destination == picker.engines[0].url.removeprefix("http://")
    finally:
        await envoy.close()
    assert await picker.metric('kvgate_epp_picks_total{result="picked"}') == 1
