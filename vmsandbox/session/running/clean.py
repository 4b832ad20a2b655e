"""`vmsandbox secret wipe`: wipe volatile credentials in a running session without touching the workspace — agent
auth files, git credentials, and the placeholders the proxy swaps for secrets (which it stops honouring)."""

from __future__ import annotations

import shlex

from vmsandbox.egress import policy
from vmsandbox.guest import commands
from vmsandbox.image import blueprint
from vmsandbox.session.record import Record


def clean_script(user: str, credentials: tuple[str, ...]) -> str:
    """Run as root in the guest: drop the placeholders and every credential file the session's blueprint or
    any shipped blueprint names (an agent may have been installed by hand); print what went."""
    rels = " ".join(shlex.quote(r) for r in dict.fromkeys([*blueprint.shipped_credentials(), *credentials]))
    return (
        "set -u; { cat /etc/vmsandbox/proxy.env; "
        "grep -v -e '=vmsandbox-placeholder-' /etc/vmsandbox/session.env || true; } "
        ">/etc/environment.new && mv /etc/environment.new /etc/environment; "
        f'for home in /root "$(getent passwd {shlex.quote(user)} | cut -d: -f6)"; do '
        '[ -n "$home" ] || continue; '
        f"for rel in {rels}; do "
        'f="$home/$rel"; if [ -e "$f" ] || [ -L "$f" ]; then rm -f -- "$f" && echo "$f"; fi; done; '
        # Docker's client config went with the credentials: its proxy settings (how containers reach the
        # network) come back, without any login
        'd="$home/.docker/config.json"; if [ ! -e "$d" ] && [ -f /etc/vmsandbox/docker-config.json ]; then '
        'install -D -m 0644 -o "$(stat -c %u "$home")" -g "$(stat -c %g "$home")" '
        '/etc/vmsandbox/docker-config.json "$d"; fi; done; '
        "git config --system --unset-all credential.helper 2>/dev/null || true"
    )


def clean(record: Record) -> list[str]:
    """Revoke the placeholders, wipe the credential files; the paths removed (guest text: print escaped)."""
    if record.files.egress_config.exists():
        policy.revoke(record.files)
    result = commands.run_as_root(
        record.endpoint(),
        clean_script(record.user, tuple(record.credentials)),
        hint=f"is the VM up? `vmsandbox logs {record.name}`",
    )
    return result.stdout.split()
