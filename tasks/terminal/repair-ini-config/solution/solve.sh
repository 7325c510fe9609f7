#!/bin/bash
set -euo pipefail
cat > /app/config/relay.ini <<'INI'
; relay.ini -- configuration of the relay message gateway
; Edited by hand during the 2024-06 migration. Run /app/bin/check_config.py after edits.

[server]
host = 0.0.0.0
workers = 4
; TLS terminates here since the migration
port = 8443
tls_cert = /etc/relay/tls/cert.pem
tls_key = /etc/relay/tls/key.pem
allowed_origins = https://app.example.com, https://admin.example.com

[database]
url = postgresql://relay@db.internal:5432/relay
pool_size = 12
pool_timeout_s = 30

[logging]
level = INFO
file = /var/log/relay/relay.log
format = %(asctime)s %(levelname)s %(message)s

[limits]
max_body_size = 10M
rate_per_minute = 600
max_connections = 2000
idle_timeout_s = 75

[queues]
names = inbound, outbound, dead-letter
retry_backoff_s = 5, 30, 300
INI
/app/bin/check_config.py
