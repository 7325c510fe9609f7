"""Settings, read from the environment with the prefix ``CRUCIBLE_`` (pydantic-settings).

Example: ``CRUCIBLE_DATABASE_URL=postgresql+psycopg://u:p@host/db crucible serve``.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class RateLimit(BaseModel):
    """A tenant's request rate: ``rps`` requests per second on average, ``burst`` at once."""

    model_config = ConfigDict(extra="forbid")

    rps: float = Field(gt=0, le=1e6)
    burst: int = Field(ge=1, le=1_000_000)


class Settings(BaseSettings):
    """Every tunable of the control plane, with units in the names."""

    model_config = SettingsConfigDict(env_prefix="CRUCIBLE_", extra="ignore")

    data_dir: Path = Field(Path(".crucible"), description="Where the embedded SQLite file lives.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/crucible.db"
    )
    redis_url: str | None = Field(None, description="Redis URL for multi-replica coordination.")
    replica: bool = Field(
        False,
        description="Serve as a replica: skip the one-server-per-deployment lock "
        "(service.serverlock); replicas coordinate through CRUCIBLE_REDIS_URL "
        "(service.coordination).",
    )
    deployment: str = Field(
        "",
        description="Value of the crucible.deployment label; reconcile touches only these. "
        "Default: derived from the database URL, so every database (every embedded "
        "data dir) owns its own containers and two deployments never reconcile each other's.",
    )
    docker_host: str | None = Field(None, description="Docker engine URL; default from env.")
    log_format: Literal["human", "json"] = Field(
        "human", description="Log lines of `crucible serve`: human, or one JSON object a line."
    )
    exec_channel: bool = Field(
        True,
        description="Send execs over each sandbox's channel socket (a bind mount under "
        "<data_dir>/channels) instead of docker exec; needs the engine on this host.",
    )
    host: str = "127.0.0.1"
    port: int = 8000

    image_prefix: str = Field("crucible", description="Repository prefix of sandbox images.")
    images_dir: Path = Field(
        Path(__file__).resolve().parent.parent / "sandbox_images",
        description="Build contexts of the sandbox images.",
    )
    base_image: str | None = Field(
        None,
        description="BASE_IMAGE for builds, e.g. debian:bookworm-slim; default: a local "
        "debootstrap image.",
    )

    pool_targets: dict[str, int] = Field(
        default_factory=lambda: {"terminal": 2, "document": 1, "cad": 1},
        description="Warm pool target size per template.",
    )
    pool_refill_concurrency: int = Field(2, ge=1, le=64)
    pool_interval_s: float = Field(0.5, gt=0, description="Pool maintainer tick.")
    reaper_interval_s: float = Field(1.0, gt=0)

    default_ttl_s: int = Field(600, ge=1)
    max_ttl_s: int = Field(24 * 3600, ge=1)
    max_exec_timeout_s: int = Field(3600, ge=1)
    default_max_output_bytes: int = Field(1 << 20, ge=1)
    max_output_bytes_limit: int = Field(16 << 20, ge=1)
    max_upload_bytes: int = Field(64 << 20, ge=1)
    max_body_bytes: int = Field(
        16 << 20,
        ge=1,
        description="Largest request body (bytes) of every route but file uploads, which "
        "have max_upload_bytes; a larger one is a 413 before it is read.",
    )
    max_json_depth: int = Field(64, ge=1, description="Deepest nesting of a JSON body.")
    body_idle_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Longest wait (seconds) for the next part of a request body that has "
        "started; past it the request is a 408 and its connection closed (nginx's "
        "client_body_timeout).",
    )
    snapshot_ttl_s: int = Field(
        24 * 3600,
        ge=1,
        description="A snapshot is deleted this long after it was made (the pool loop "
        "expires it); a tenant's snapshots count against its snapshot quota until then.",
    )
    max_fork_n: int = Field(64, ge=1)

    default_quota_sandboxes: int = Field(32, ge=0)
    default_quota_cpus: float = Field(32.0, ge=0)
    default_quota_memory_mb: int = Field(64 * 1024, ge=0)

    tasks_dir: Path = Field(
        Path(__file__).resolve().parent.parent / "tasks",
        description="Root of the task suites (one folder per suite).",
    )
    tasks_rescan_interval_s: float = Field(
        1.0,
        ge=0,
        description="Suites are re-read from tasks_dir when its folders or task files "
        "changed, checked at most this often (a task added after serve starts is found).",
    )
    image_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="FROM references of task Dockerfiles mapped to local images, e.g. "
        '{"debian:bookworm-slim": "crucible/base:latest"} (JSON); merged over '
        "image_aliases_file.",
    )
    image_aliases_file: Path | None = Field(
        None, description='A TOML file of [aliases] "<FROM reference>" = "<local image>".'
    )
    build_ca_bundle: Path | None = Field(
        None,
        description="A PEM CA bundle on this host (e.g. /etc/ssl/certs/ca-certificates.crt) "
        "that task builds see during their RUN steps (PIP_CERT, REQUESTS_CA_BUNDLE, "
        "SSL_CERT_FILE, CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS); removed from the image after.",
    )
    build_pip_index_url: str | None = Field(
        None, description="PIP_INDEX_URL (and UV_DEFAULT_INDEX) for task builds."
    )
    build_apt_mirror: str | None = Field(
        None,
        description="A Debian mirror URL replacing deb.debian.org in task builds' apt "
        "sources (kept in the image).",
    )
    build_proxy: str | None = Field(
        None, description="HTTP_PROXY and HTTPS_PROXY for task builds (not kept in the image)."
    )
    build_no_proxy: str | None = Field(None, description="NO_PROXY for task builds.")
    build_attempts: int = Field(
        3, ge=1, le=10, description="Attempts of a task build whose failure looks transient."
    )
    build_retry_delay_s: float = Field(2.0, ge=0, description="First delay between attempts.")
    verifier_network: Literal["none", "bridge"] = Field(
        "none",
        description="The network a verifier sandbox may get (never the agent's): none, or "
        "bridge (reach a package index or proxy; set it in verifier_env).",
    )
    verifier_network_tasks: Literal["asking", "all"] = Field(
        "asking",
        description="Which tasks' verifiers get verifier_network: those whose task.toml "
        "asks ([verifier] network = true), or all.",
    )
    verifier_env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of verifier sandboxes that get a network, e.g. "
        '{"PIP_INDEX_URL": "...", "HTTPS_PROXY": "..."} (JSON).',
    )
    verifier_ca_bundle: Path | None = Field(
        None,
        description="A PEM CA bundle placed in verifier sandboxes that get a network, "
        "named by PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE and CURL_CA_BUNDLE.",
    )
    keep_episode_snapshots: bool = Field(
        False, description="Keep each episode's final snapshot image after verification."
    )
    read_host_layers: bool = Field(
        True,
        description="Read a sandbox's overlay2 layers on this host when it can (fast diffs); "
        "false reads every end state through the engine's API, as a control plane without "
        "the engine's storage (the compose stack) does.",
    )

    bootstrap_admin_key: str | None = Field(
        None, description="If set, an admin key with this secret exists at start-up."
    )

    dashboard_session_secret: str | None = Field(
        None,
        description="Key (any string, >= 32 characters advised) that signs the dashboard's "
        "session cookies and CSRF tokens; default: random per process (sessions end at "
        "restart). Set it when several replicas serve the dashboard.",
    )
    dashboard_session_ttl_s: int = Field(
        8 * 3600, ge=60, le=30 * 24 * 3600, description="Lifetime of a dashboard session."
    )
    dashboard_refresh_s: float = Field(
        3.0, gt=0, le=3600, description="How often the dashboard's live panels re-read."
    )

    rate_limit: RateLimit | None = Field(
        None,
        description="Every tenant's request rate unless rate_limits names it, e.g. "
        '\'{"rps": 50, "burst": 100}\'; none: no limit (the check is skipped).',
    )
    rate_limits: dict[str, RateLimit | None] = Field(
        default_factory=dict,
        description='Per-tenant request rates, e.g. \'{"team-a": {"rps": 5, "burst": 10}}\'; '
        "null for a tenant exempts it from rate_limit. Shared across replicas via Redis.",
    )
    fast_lane: bool = Field(
        True,
        description="Serve one-shot POST /v1/sandboxes/{id}/exec and POST /v1/sandboxes "
        "(lease) through the fast lane (service.api.fastlane: no routing or dependency "
        "resolution per request; the same checks, answers and audit events). false: every "
        "request goes through the full stack.",
    )
    key_cache_ttl_s: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="How long an API-key lookup is cached; a revoke through the API reaches "
        "every replica at once (pub/sub), any other within this bound. 0: no cache.",
    )

    @model_validator(mode="after")
    def _default_deployment(self) -> Settings:
        if not self.deployment:
            digest = hashlib.sha256(self.sqlalchemy_url.encode()).hexdigest()[:10]
            self.deployment = f"crucible-{digest}"
        return self

    @property
    def sqlalchemy_url(self) -> str:
        """The effective database URL (the embedded SQLite file when none is configured)."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'crucible.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    """Process-wide settings, read once."""
    return Settings()
