"""docker/compose.yaml as Docker Compose reads it (`config`, every profile; no daemon
needed), and what it wires together: images built from this repository's Dockerfiles,
the lanes of each worker, mounted files that exist, and a Prometheus scrape job for
every service that serves metrics."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
PROFILES = ["--profile", "gpu", "--profile", "monitoring"]


def compose_command() -> list[str]:
    """The compose plugin (`docker compose`) where installed, else the standalone
    `docker-compose`; skips, saying why, when neither is."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True,
                                 check=False).returncode == 0:
        return [docker, "compose"]
    if standalone := shutil.which("docker-compose"):
        return [standalone]
    pytest.skip("neither the docker compose plugin nor docker-compose is installed "
                "(Debian: apt-get install docker-compose); `make test` installs it")


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    cmd = [*compose_command(), "-p", "inferq", "-f", str(COMPOSE), *PROFILES, "config"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    loaded: dict[str, Any] = yaml.safe_load(res.stdout)
    return loaded


def test_every_service_is_valid_and_built_from_this_repository(config: dict[str, Any]
                                                               ) -> None:
    services = config["services"]
    assert {"postgres", "redis", "minio", "migrate", "api", "worker-control", "worker",
            "worker-spot", "worker-gpu0", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        build = svc.get("build")
        if build is None:
            continue
        dockerfile = Path(build["context"]) / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"
        assert Path(build["context"]).resolve() == ROOT, name


def test_workers_and_their_lanes(config: dict[str, Any]) -> None:
    s = config["services"]
    assert s["worker-control"]["command"] == ["--lanes", "control"]
    assert s["worker"]["command"] == ["--lanes", "realtime,jobs,batch"]
    assert s["worker-spot"]["command"] == ["--spot"]
    gpu = s["worker-gpu0"]
    assert gpu["build"]["dockerfile"].endswith("Dockerfile.worker-cuda")
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["device_ids"] == ["0"] and "gpu" in devices[0]["capabilities"]
    for name in ("api", "worker", "worker-control", "worker-spot", "worker-gpu0", "migrate"):
        env = s[name]["environment"]
        assert env["INFERQ_OBJECT_STORE_URL"].startswith("s3://"), name
        assert env["INFERQ_DATABASE_URL"].startswith("postgresql"), name
        assert env["INFERQ_REDIS_URL"].startswith("redis://"), name


def test_mounted_files_exist_and_prometheus_scrapes_every_metrics_service(
        config: dict[str, Any]) -> None:
    for name, svc in config["services"].items():
        for vol in svc.get("volumes", []):
            if isinstance(vol, dict) and vol.get("type") == "bind":
                assert Path(vol["source"]).exists(), f"{name}: {vol['source']} is missing"
    scrape = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    scraped = {n for job in scrape["scrape_configs"] for sd in job.get("dns_sd_configs", [])
               for n in sd["names"]}
    serving = {n for n, svc in config["services"].items()
               if "INFERQ_WORKER_METRICS_PORT" in svc.get("environment", {})} | {"api"}
    assert serving <= scraped, serving - scraped
    assert scraped <= set(config["services"]), scraped - set(config["services"])


def test_prometheus_sends_the_token_the_api_asks_for() -> None:
    """The API's /metrics answers its metrics token only: the scrape job of the API
    carries the token compose gives the API (read as YAML, anchors resolved)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    token = compose["services"]["api"]["environment"]["INFERQ_METRICS_TOKEN"]
    scrape = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    (api,) = [job for job in scrape["scrape_configs"] if job["job_name"] == "inferq-api"]
    assert api["authorization"] == {"type": "Bearer", "credentials": token}
    assert token
