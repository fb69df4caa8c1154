"""Routing configs: the built-ins are one, files round-trip, mistakes stop start-up."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.errors import ConfigError
from gateway.routing import load_specs
from gateway.routing.config import BUILTIN, normalise, read_config
from gateway.routing.router import build_policies
from gateway.settings import AIBRIX_STRATEGIES, POLICIES, Settings
from tests.gateway.conftest import MODEL, StartGateway


def test_the_builtin_policies_are_a_routing_config() -> None:
    specs = load_specs(None)
    assert set(specs) == set(POLICIES)
    assert specs == normalise(read_config(BUILTIN), "builtin")


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_config_file_round_trips_to_the_builtin_profiles(tmp_path: Path, suffix: str) -> None:
    builtin = build_policies(Settings(), random.Random(0))
    path = tmp_path / f"routing{suffix}"
    if suffix == ".toml":
        path.write_bytes(BUILTIN.read_bytes())
    else:
        path.write_text(yaml.safe_dump({"profiles": read_config(BUILTIN)["profiles"]}))
    loaded = build_policies(Settings(routing_config=path), random.Random(0))
    assert {name: p.spec for name, p in loaded.items()} == {
        name: p.spec for name, p in builtin.items()
    }
    for name, profile in loaded.items():
        other = builtin[name]
        assert [f.name for f in profile.filters] == [f.name for f in other.filters]
        assert [(w.scorer.name, w.weight) for w in profile.scorers] == [
            (w.scorer.name, w.weight) for w in other.scorers
        ]
        assert profile.picker.name == other.picker.name
        assert [p.name for p in profile.preferences] == [p.name for p in other.preferences]


def test_a_config_adds_profiles_and_replaces_builtins(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(
        "profiles:\n"
        "  cheap-first:\n"
        "    filters: [routable, {type: hot-spot-guard, margin: 3}]\n"
        "    scorers: [{type: load, weight: 2.0, scale: 4}]\n"
        "    picker: max-score\n"
        "  prefix-cache:\n"
        "    scorers: [predicted-ttft]\n"
        "    costs: [ttft-cost, {type: delay-cost, weight: 0.5}]\n"
        "    picker: min-cost\n"
    )
    policies = build_policies(Settings(routing_config=path, default_policy="cheap-first"),
                              random.Random(0))  # fmt: skip
    assert set(policies) == {*POLICIES, "cheap-first"}
    cheap = policies["cheap-first"]
    assert cheap.filters[1].margin == 3  # type: ignore[attr-defined]
    assert cheap.scorers[0].weight == 2.0
    assert not cheap.uses_prefix
    assert policies["prefix-cache"].picker.costs[1].weight == 0.5  # type: ignore[attr-defined]
    assert policies["prefix-cache"].filters == []


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[profiles.x]\npicker = "fastest"\n', "fastest"),
        ('[profiles.x]\nfilters = ["routable", "nope"]\npicker = "random"\n', "nope"),
        ('[profiles.x]\nscorers = [{ type = "load", scael = 2 }]\npicker = "max-score"\n',
         "scael"),
        ('[profiles.x]\nscorers = [{ type = "load", weight = "heavy" }]\npicker = "max-score"\n',
         "weight"),
        ('[profiles.x]\nfilters = [{ type = "slo-feasible", shed = "yes" }]\npicker = "random"\n',
         "shed"),
        ('[profiles.x]\npicker = "min-cost"\n', "costs"),
        ('[profiles.x]\ncosts = ["ttft-cost"]\npicker = "random"\n', "min-cost"),
        ('[profiles.x]\nfilters = [{ type = "hot-spot-guard", margin = 0 }]\npicker = "random"\n',
         "margin"),
        ('[profiles.x]\nscorers = ["load"]\n', "picker"),
        ('[profiles.x]\npicker = "random"\nfliters = []\n', "fliters"),
        ("[profiles.x\n", "TOML"),
        ('[profiles.x]\nscorers = [{ type = "load", weight = inf }]\npicker = "max-score"\n',
         "weight=inf"),
        ('[profiles.x]\nscorers = [{ type = "load", weight = 1e308 }]\npicker = "max-score"\n',
         "weight=1e+308"),
        ('[profiles.x]\nscorers = [{ type = "load", weight = nan }]\npicker = "max-score"\n',
         "weight=nan"),
        ('[profiles.x]\nscorers = [{ type = "load", weight = 1001 }]\npicker = "max-score"\n',
         "[0, 1000]"),
        ('[profiles.x]\nscorers = [{ type = "load", scale = inf }]\npicker = "max-score"\n',
         "scale=inf"),
        ('[profiles.x]\npicker = { type = "session", max_sessions = 1_000_000_000_000 }\n',
         "max_sessions"),
        ('[profiles.x]\ncosts = [{ type = "delay-cost", weight = 9e99 }]\npicker = "min-cost"\n',
         "weight"),
        ('[profiles.x]\nfilters = [{ type = "hot-spot-guard", margin = 4294967296 }]\n'
         'picker = "random"\n', "margin"),
    ],
)  # fmt: skip
def test_a_bad_config_names_what_is_wrong(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "routing.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        build_policies(Settings(routing_config=path), random.Random(0))
    assert named in str(refused.value)


@pytest.mark.parametrize("weight", [".inf", "1e308", ".nan", "-1"])
def test_a_yaml_config_s_bad_weight_is_refused(tmp_path: Path, weight: str) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(f"profiles:\n  x:\n    scorers: [{{type: load, weight: {weight}}}]\n"
                    "    picker: max-score\n")  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        build_policies(Settings(routing_config=path), random.Random(0))
    assert "profile x.scorers[0] (load).weight=" in str(refused.value)
    assert "a number in [0, 1000]" in str(refused.value)


async def test_match_answers_with_every_value_at_its_bound(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    """The largest weights and parameters a config may hold: /admin/match still answers
    finite scores (no inf to serialize, no 500)."""
    path = tmp_path / "routing.toml"
    path.write_text(
        "[profiles.heavy]\n"
        'filters = ["routable", { type = "hot-spot-guard", margin = 2147483647 }]\n'
        'scorers = [{ type = "prefix", weight = 1000, gpu_weight = 1, cpu_weight = 1 },'
        ' { type = "load", weight = 1000, scale = 1e-9 },'
        ' { type = "kv-usage", weight = 1000 }, { type = "predicted-ttft", weight = 1000 }]\n'
        'picker = { type = "session", max_sessions = 10000000 }\n'
        "[profiles.slow]\n"
        'filters = ["routable", "slo-feasible"]\n'
        'costs = ["ttft-cost", { type = "delay-cost", weight = 100 },'
        ' { type = "arrival-cost", weight = 100 }]\n'
        'placement = { type = "first-turn", load_tolerance = 10 }\n'
        'picker = "min-cost"\n'
    )
    gw = await start_gateway(engines=2, routing_config=path, default_policy="heavy",
                             cost_prior_scale=1000.0)  # fmt: skip
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 50}]}
    async with gw.client() as client:  # load on the pods, then a match per profile
        for _ in range(3):
            sent = await client.post("/v1/chat/completions", json={**body, "max_tokens": 2})
            assert sent.status_code == 200
    async with gw.admin() as admin:
        for policy in ("heavy", "slow"):
            answer = await admin.post(
                "/admin/match", json=body, headers={"x-kvgate-policy": policy}
            )
            assert answer.status_code == 200, answer.text
            for pod in answer.json()["pods"].values():
                assert pod["score"] is None or 0.0 <= pod["score"] <= 4000.0


def test_an_unknown_default_policy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "routing.toml"
    path.write_text('[profiles.mine]\npicker = "random"\n')
    with pytest.raises(ConfigError, match="KVGATE_DEFAULT_POLICY"):
        build_policies(Settings(routing_config=path, default_policy="yours"), random.Random(0))


def test_serve_refuses_a_bad_routing_config_at_start(tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text('{"pods": [{"name": "a", "url": "http://127.0.0.1:9", "model": "m"}]}')
    config = tmp_path / "routing.toml"
    config.write_text('[profiles.x]\nscorers = [{ type = "prefix", gpu_weight = 2 }]\n'
                      'picker = "max-score"\n')  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods),
         "--routing-config", str(config), "--port", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "gpu_weight" in done.stderr and "profile x" in done.stderr


async def test_aibrix_strategy_names_route_as_their_kvgate_policies(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with gw.client() as client:
        for strategy, policy in AIBRIX_STRATEGIES.items():
            answer = await client.post(
                "/v1/chat/completions", json=body, headers={"routing-strategy": strategy}
            )
            assert answer.status_code == 200, strategy
            assert answer.headers["x-kvgate-policy"] == policy
        refused = await client.post(
            "/v1/chat/completions", json=body, headers={"routing-strategy": "throughput"}
        )
    assert refused.status_code == 400
    assert "least-kv-cache" in refused.json()["error"]["message"]  # what it could have asked
