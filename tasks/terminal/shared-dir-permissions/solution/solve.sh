#!/bin/bash
set -euo pipefail
S=/srv/projects
# orphaned owners -> alice (before anything else)
find $S/shared -type f -nouser -exec chown alice {} +
chown root:analysts $S/shared
find $S/shared -type d -exec chown root:analysts {} + -exec chmod 2770 {} +
find $S/shared -type f -exec chgrp analysts {} + -exec chmod 0660 {} +
find $S/shared -type f -name '*.sh' -exec chmod 0770 {} +
chown -R carol:auditors $S/audit
find $S/audit -type d -exec chmod 0750 {} +
find $S/audit -type f -exec chmod 0640 {} +
chown root:root $S/dropbox
chmod 1733 $S/dropbox
chown alice:alice /app/deploy/id_deploy /app/deploy/id_deploy.pub
chmod 0600 /app/deploy/id_deploy
chmod 0644 /app/deploy/id_deploy.pub
echo 'umask 0007' >> /home/alice/.profile
chown alice:alice /home/alice/.profile
