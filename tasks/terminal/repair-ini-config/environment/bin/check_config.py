#!/usr/bin/env python3
"""Validate the relay configuration: check_config.py [PATH] (default /app/config/relay.ini).

Exit status 0 and "OK" when valid; otherwise prints one problem per line and exits 1.
"""
import configparser
import re
import sys

SCHEMA = {
    "server": {"host": "host", "port": "port", "workers": "posint", "tls_cert": "path",
               "tls_key": "path", "allowed_origins": "origins"},
    "database": {"url": "pgurl", "pool_size": "posint", "pool_timeout_s": "posint"},
    "logging": {"level": "level", "file": "path", "format": "str"},
    "limits": {"max_body_size": "size", "rate_per_minute": "posint", "max_connections": "posint",
               "idle_timeout_s": "posint"},
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


if __name__ == "__main__":
    problems = validate(sys.argv[1] if len(sys.argv) > 1 else "/app/config/relay.ini")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print("OK")
