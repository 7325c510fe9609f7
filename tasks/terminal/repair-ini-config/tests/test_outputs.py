"""Verifier for repair-ini-config. Uses its own pristine copy of the checker."""

import configparser
import re
import subprocess

SCHEMA = {
    "server": {
        "host": "host",
        "port": "port",
        "workers": "posint",
        "tls_cert": "path",
        "tls_key": "path",
        "allowed_origins": "origins",
    },
    "database": {"url": "pgurl", "pool_size": "posint", "pool_timeout_s": "posint"},
    "logging": {"level": "level", "file": "path", "format": "str"},
    "limits": {
        "max_body_size": "size",
        "rate_per_minute": "posint",
        "max_connections": "posint",
        "idle_timeout_s": "posint",
    },
    "queues": {"names": "list", "retry_backoff_s": "intlist"},
}


def check_value(kind, value):
    if kind == "posint":
        return value.isdigit() and int(value) > 0
    if kind == "port":
        return value.isdigit() and 1 <= int(value) <= 65535
    if kind == "host":
        return re.fullmatch(r"[A-Za-z0-9.-]+", value) is not None
    if kind == "path":
        return value.startswith("/")
    if kind == "pgurl":
        return re.fullmatch(r"postgresql://[^@\s]+@[^:\s/]+:\d+/\w+", value) is not None
    if kind == "level":
        return value in {"DEBUG", "INFO", "WARNING", "ERROR"}
    if kind == "size":
        return re.fullmatch(r"\d+[KMG]", value) is not None
    if kind == "origins":
        return all(re.fullmatch(r"https://[a-z0-9.-]+", o.strip()) for o in value.split(","))
    if kind == "list":
        return all(o.strip() for o in value.split(","))
    if kind == "intlist":
        return all(o.strip().isdigit() for o in value.split(","))
    return bool(value)


def validate(path):
    cp = configparser.ConfigParser(strict=True, interpolation=None, empty_lines_in_values=False)
    try:
        with open(path, encoding="utf-8") as f:
            cp.read_file(f)
    except (configparser.Error, OSError) as e:
        return [f"parse error: {e}".replace("\n", " ")]
    problems = []
    for section, keys in SCHEMA.items():
        if not cp.has_section(section):
            problems.append(f"missing section [{section}]")
            continue
        for key, kind in keys.items():
            if not cp.has_option(section, key):
                problems.append(f"[{section}] missing key {key}")
            elif not check_value(kind, cp.get(section, key)):
                problems.append(f"[{section}] {key}: invalid {kind} value {cp.get(section, key)!r}")
        for key in cp.options(section):
            if key not in keys:
                problems.append(f"[{section}] unknown key {key}")
    for section in cp.sections():
        if section not in SCHEMA:
            problems.append(f"unknown section [{section}]")
    return problems


CONFIG = "/app/config/relay.ini"
EXPECTED = {
    "server": {
        "host": "0.0.0.0",
        "port": "8443",
        "workers": "4",
        "tls_cert": "/etc/relay/tls/cert.pem",
        "tls_key": "/etc/relay/tls/key.pem",
        "allowed_origins": ["https://app.example.com", "https://admin.example.com"],
    },
    "database": {"url": "postgresql://relay@db.internal:5432/relay", "pool_size": "12", "pool_timeout_s": "30"},
    "logging": {"level": "INFO", "file": "/var/log/relay/relay.log", "format": "%(asctime)s %(levelname)s %(message)s"},
    "limits": {"max_body_size": "10M", "rate_per_minute": "600", "max_connections": "2000", "idle_timeout_s": "75"},
    "queues": {"names": ["inbound", "outbound", "dead-letter"], "retry_backoff_s": ["5", "30", "300"]},
}
LISTS = {("server", "allowed_origins"), ("queues", "names"), ("queues", "retry_backoff_s")}


def _parsed():
    cp = configparser.ConfigParser(strict=True, interpolation=None, empty_lines_in_values=False)
    with open(CONFIG, encoding="utf-8") as f:
        cp.read_file(f)
    out = {}
    for s in cp.sections():
        out[s] = {}
        for k, v in cp.items(s):
            out[s][k] = [x.strip() for x in v.split(",")] if (s, k) in LISTS else v.strip()
    return out


def test_pristine_checker_accepts_config():
    assert validate(CONFIG) == []


def test_shipped_checker_prints_ok():
    r = subprocess.run(["python3", "/app/bin/check_config.py"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr


def test_sections():
    assert sorted(_parsed()) == sorted(EXPECTED)


def test_server_settings():
    assert _parsed()["server"] == EXPECTED["server"]


def test_other_settings_preserved():
    got = _parsed()
    for s in ("database", "logging", "limits", "queues"):
        assert got[s] == EXPECTED[s], s
