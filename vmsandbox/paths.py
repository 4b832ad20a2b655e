"""Where vmsandbox keeps things, and the name of every per-session file, in one place.

Layout (root; see docs/configuration.md, "Where things live"):

    /var/lib/vmsandbox/images/base-<version>/   immutable base images (disk.qcow2, vmlinuz, initrd.img,
                                                manifest.json); `.tmp-*` are builds in progress
    /var/lib/vmsandbox/cache/                   package cache for image builds
    /var/lib/vmsandbox/state/sessions/<name>/   one directory per session (files below)
    ~/.config/vmsandbox/config.yaml             user configuration
    ~/.config/vmsandbox/secrets/<NAME>          secrets (0600; never enter a VM)

A non-root user keeps sessions under $XDG_STATE_HOME/vmsandbox. Every directory can be moved with
VMSANDBOX_DATA_DIR, VMSANDBOX_STATE_DIR and VMSANDBOX_CONFIG_DIR.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from vmsandbox import sudo
from vmsandbox.errors import UsageError, VmsandboxError

APP = "vmsandbox"
SYSTEM_DIR = Path("/var/lib/vmsandbox")

# Files inside an image directory.
IMAGE_DISK = "disk.qcow2"
IMAGE_KERNEL = "vmlinuz"
IMAGE_INITRD = "initrd.img"
IMAGE_MANIFEST = "manifest.json"
IMAGE_PINS = ".pins"  # in the images directory: what each account's sessions rest on (session.pins)
IMAGE_TEMPLATES = "templates"  # its warm-start templates (shared with the libvirt group, like the store)
RUNTIME_DIR = Path("/run/vmsandbox")  # root's: what lives while processes live (memory holders)

# Files inside a session directory.
SESSION_RECORD = "session.json"
SESSION_OVERLAY = "overlay.qcow2"
SESSION_CLIENT_KEY = "id_ed25519"
SESSION_HOST_KEY = "ssh_host_ed25519_key"
SESSION_KNOWN_HOSTS = "known_hosts"
SESSION_SSH_CONFIG = "ssh_config"
SESSION_CONSOLE_LOG = "console.log"
SESSION_DOMAIN_XML = "domain.xml"
SESSION_FWCFG_DIR = "fwcfg"
SESSION_LOG = "vmsandbox.log"
SESSION_BASELINE_DIR = "baseline"  # the project as captured at session start (immutable)
SESSION_BASELINE_MANIFEST = "baseline.json"
SESSION_WORKSPACE_DISK = "workspace.raw"  # ext4 built from the baseline; the guest mounts it at the project path
SESSION_MIRROR_DIR = "mirror"  # the mirror's place; under root, where its own file system is mounted
SESSION_MIRROR_IMAGE = "mirror.img"  # that file system (sparse, root's): sync.fetch.volume
SESSION_GUEST_DIR = "guest"  # in the mirror's place: the guest's project tree as of the last fetch
SESSION_DECISIONS = "decisions.json"  # which guest changes were applied or otherwise dealt with
SESSION_OUTBOX = "outbox"  # unsynced changes exported when the VM went away (patch, files, git bundle)
SESSION_EGRESS_CONFIG = "egress.json"  # the proxy's policy and secret mappings (re-read per connection)
SESSION_EGRESS_DAEMON = "egress-daemon.json"  # what the proxy daemon serves (its spec, written by the session)
SESSION_EGRESS_STATE = "egress-state.json"  # the proxy daemon: pid, and whether the guest's door is open
SESSION_EGRESS_LOG = "egress.log"  # the proxy daemon's own messages
SESSION_PROXY_LOG = "proxy.jsonl"  # one JSON line per guest connection: `vmsandbox policy log NAME`
SESSION_CA_CERT = "session-ca.pem"  # per-session CA for secret-injecting hosts (the guest trusts it)
SESSION_CA_KEY = "session-ca.key"  # its private key: host only, 0600
SESSION_CHECKPOINTS = "checkpoints"  # one directory per checkpoint: memory.save, workspace.raw, checkpoint.json
FANOUT_CAPTURE_PREFIX = ".capture-"  # in the sessions directory: a fan-out's one capture, while it starts them
SESSION_SANDBOX = "sandbox.json"  # a session made through the API: its end, environment and metadata
SESSION_ROLLED_BACK = "rolled-back"  # unsynced work a rollback would have lost, one outbox-like box per rollback
# ssh's connection multiplexing: one login serves the command, rsync and later execs (%r: one per user)
SESSION_SSH_SOCKET = "ssh-%r.sock"


def _is_root() -> bool:
    return os.geteuid() == 0


def data_dir() -> Path:
    """Images and caches: system-wide, readable by libvirt's QEMU user."""
    env = os.environ.get("VMSANDBOX_DATA_DIR")
    return Path(env) if env else SYSTEM_DIR


def state_dir() -> Path:
    env = os.environ.get("VMSANDBOX_STATE_DIR")
    if env:
        return Path(env)
    if _is_root():
        return SYSTEM_DIR / "state"
    return Path(platformdirs.user_state_dir(APP))


def sandbox_projects() -> Path:
    """Where the empty project of each API sandbox of its own is made (one directory per sandbox)."""
    return state_dir() / "sandboxes"


def config_dir() -> Path:
    """The user's configuration and secrets. Under sudo, the invoking user's (~/.config/vmsandbox of SUDO_USER):
    the same config and secrets with and without sudo, as the agent settings a session copies are theirs."""
    env = os.environ.get("VMSANDBOX_CONFIG_DIR")
    if env:
        return Path(env)
    invoker = sudo.invoker()
    if invoker is not None:
        return Path(invoker.pw_dir) / ".config" / APP
    return Path(platformdirs.user_config_dir(APP))


def config_subdir(path: Path) -> None:
    """mkdir -p of a directory under config_dir(), 0700 (call it in sudo.as_invoker: under sudo, the invoker's)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def images_dir() -> Path:
    return data_dir() / "images"


def cache_dir() -> Path:
    return data_dir() / "cache"


def sessions_dir() -> Path:
    return state_dir() / "sessions"


# The memory guard of a sessions directory: its module, run as a process of its own (started by the local place,
# which may not import it), and where it says there where it runs and what it did
GUARD_MODULE = "vmsandbox.session.host.memoryguard"
GUARD_PID = "guard.pid"
GUARD_LOG = "guard.log"


def memory_holders_dir() -> Path:
    """Where the holders of templates' sealed memory files say where they are (one JSON file per template): a
    runtime directory of root's, as only root starts them (VMSANDBOX_RUNTIME_DIR moves it: to a directory of
    root's that no one else may write, or not at all — root trusts what it reads there)."""
    env = os.environ.get("VMSANDBOX_RUNTIME_DIR")
    if not env:
        return RUNTIME_DIR / "memory"
    moved = Path(env)
    with contextlib.suppress(FileNotFoundError):  # (made by root when first used)
        st = moved.stat() if os.geteuid() == 0 else None  # (another account reads nothing there: entries below)
        if st is not None and (st.st_uid != 0 or st.st_mode & 0o022):
            raise VmsandboxError(
                f"VMSANDBOX_RUNTIME_DIR={env} is not root's alone (others may write there)",
                hint="unset it (the default is /run/vmsandbox), or point it at a directory root owns, mode 0700",
            )
    return moved / "memory"


def failed_boots_dir() -> Path:
    """Consoles of boots that failed, kept after their session is gone."""
    return state_dir() / "failed-boots"


@dataclass(frozen=True)
class SessionPaths:
    """The files of one session directory."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / SESSION_RECORD

    @property
    def overlay(self) -> Path:
        return self.root / SESSION_OVERLAY

    @property
    def client_key(self) -> Path:
        return self.root / SESSION_CLIENT_KEY

    @property
    def host_key(self) -> Path:
        return self.root / SESSION_HOST_KEY

    @property
    def known_hosts(self) -> Path:
        return self.root / SESSION_KNOWN_HOSTS

    @property
    def ssh_config(self) -> Path:
        return self.root / SESSION_SSH_CONFIG

    @property
    def console_log(self) -> Path:
        return self.root / SESSION_CONSOLE_LOG

    @property
    def domain_xml(self) -> Path:
        return self.root / SESSION_DOMAIN_XML

    def hashes(self, tree: str) -> Path:
        """The hash cache of a tree a pull scans ("project" or "mirror"): see sync.tree.hashcache."""
        return self.root / f"hashes.{tree}.json"

    @property
    def saved_memory(self) -> Path:
        """A stopped session's memory and device state (`vmsandbox stop`)."""
        return self.root / "saved.memory"

    @property
    def checkpoints(self) -> Path:
        return self.root / SESSION_CHECKPOINTS

    @property
    def rolled_back(self) -> Path:
        return self.root / SESSION_ROLLED_BACK

    @property
    def identity_socket(self) -> Path:
        return self.root / "identity.sock"

    @property
    def fwcfg_dir(self) -> Path:
        return self.root / SESSION_FWCFG_DIR

    @property
    def log(self) -> Path:
        return self.root / SESSION_LOG

    @property
    def baseline(self) -> Path:
        return self.root / SESSION_BASELINE_DIR

    @property
    def steps(self) -> Path:
        return self.root / "steps"  # one file per step the session was asked to run (sync.provenance.steps)

    @property
    def baseline_manifest(self) -> Path:
        return self.root / SESSION_BASELINE_MANIFEST

    @property
    def workspace_disk(self) -> Path:
        return self.root / SESSION_WORKSPACE_DISK

    @property
    def mirror(self) -> Path:
        return self.root / SESSION_MIRROR_DIR

    @property
    def mirror_image(self) -> Path:
        return self.root / SESSION_MIRROR_IMAGE

    @property
    def guest_tree(self) -> Path:
        return self.mirror / SESSION_GUEST_DIR

    @property
    def decisions(self) -> Path:
        return self.root / SESSION_DECISIONS

    @property
    def outbox(self) -> Path:
        return self.root / SESSION_OUTBOX

    @property
    def ssh_socket(self) -> Path:
        return self.root / SESSION_SSH_SOCKET

    @property
    def egress_config(self) -> Path:
        return self.root / SESSION_EGRESS_CONFIG

    @property
    def egress_daemon(self) -> Path:
        return self.root / SESSION_EGRESS_DAEMON

    @property
    def egress_state(self) -> Path:
        return self.root / SESSION_EGRESS_STATE

    @property
    def egress_log(self) -> Path:
        return self.root / SESSION_EGRESS_LOG

    @property
    def proxy_log(self) -> Path:
        return self.root / SESSION_PROXY_LOG

    @property
    def ca_cert(self) -> Path:
        return self.root / SESSION_CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.root / SESSION_CA_KEY


# A session's name: anchored at both ends (no `$`, which lets a trailing newline through), so it holds no
# separator, no control character and no dot: it names one directory under sessions_dir() and nothing else.
SESSION_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")
NAME_HINT = "a session name is 1-31 lowercase letters, digits and dashes, starting with a letter or digit"


def is_session_name(name: str) -> bool:
    return SESSION_NAME.fullmatch(name) is not None


def session_paths(name: str) -> SessionPaths:
    """The files of the session `name`: refused unless it is a session's name (the one check every way of
    opening a session by name goes through: a command's argument, a page's field, an API's path)."""
    if not is_session_name(name):
        raise UsageError(f"invalid session name {name!r}", hint=NAME_HINT)  # exit 2, whoever named it
    return SessionPaths(sessions_dir() / name)


READER_PREFIX = ".reader-"  # in the sessions directory: the reader VM of a dead VM's disk (session.end.diskreader)
READER_NAME = re.compile(r"\.reader-[a-z0-9][a-z0-9-]{0,30}-[0-9a-f]{4}")


def reader_paths(name: str) -> SessionPaths:
    """The files of a reader VM (`.reader-SESSION-XXXX`: not a session; `ls` and every command by name skip
    it, since its name is no session's)."""
    if READER_NAME.fullmatch(name) is None:
        raise VmsandboxError(f"invalid reader name {name!r}")
    return SessionPaths(sessions_dir() / name)


def fanout_capture(group: str) -> SessionPaths:
    """Where a fan-out captures its project once (not a session: its name starts with a dot, so `ls` skips it)."""
    if not is_session_name(group):
        raise UsageError(f"invalid fan-out group name {group!r}", hint=NAME_HINT)
    return SessionPaths(sessions_dir() / (FANOUT_CAPTURE_PREFIX + group))
