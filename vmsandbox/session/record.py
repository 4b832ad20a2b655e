"""A session's record (session.json): what was made, for whom, and how to reach it. libvirt is the source of
truth for what runs; the record lets `ls`, `destroy` and `gc` find what a crashed or killed `vmsandbox` left
behind. Values are typed here (enums, ports) and plain in the JSON; the file itself is recordfile.py's (read
bounded, its copy, one save at a time)."""

from __future__ import annotations

import enum
import functools
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vmsandbox import filewrite, paths, pids
from vmsandbox.egress.ports import Publish
from vmsandbox.egress.rules.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.session import recordfile
from vmsandbox.sync.target import Target

DOMAIN_PREFIX = "vmsandbox-"


def domain_name(session: str) -> str:
    """The libvirt domain of a session. Every account of the libvirt group shares qemu:///system's one namespace
    of domain names, so an unprivileged user's carry their uid: `vmsandbox-u1000-exp1` (root's: `vmsandbox-exp1`)."""
    uid = os.geteuid()
    return f"{DOMAIN_PREFIX}{session}" if uid == 0 else f"{DOMAIN_PREFIX}u{uid}-{session}"


class Phase(enum.StrEnum):
    """How far creating the session got (the record is written before the VM exists)."""

    CREATING = "creating"
    READY = "ready"  # booted, and its egress (if any) open


class State(enum.StrEnum):
    """What `ls` says of a session."""

    BOOTING = "booting"  # being created by a live `vmsandbox run`
    RUNNING = "running"
    PAUSED = "paused"
    ORPHANED = "orphaned"  # its `vmsandbox run` died (kill -9) and it was not --keep
    STOPPED = "stopped"  # `vmsandbox stop` saved it to disk; `vmsandbox start` resumes it
    EXITED = "exited"  # the VM is gone (it powered off, crashed, or was destroyed)
    EXPORTED = "exported"  # the VM is gone; its unsynced changes wait in the outbox
    ENDING = "ending"  # reviewed; its VM is being destroyed in the background (gc finishes it if interrupted)
    UNKNOWN = "unknown"  # libvirt did not answer: what the record says is all that is known


@dataclass
class Record:
    name: str
    project: str
    image_version: str
    accel: str
    accel_reason: str
    cpus: int
    memory_mib: int
    disk_mib: int
    ssh_port: int
    user: str
    uid: int
    gid: int
    libvirt_uri: str
    created: float = field(default_factory=time.time)
    keep: bool = False
    owner_pid: int | None = None
    owner_start: str | None = None
    status: Phase = Phase.CREATING
    boot_seconds: float | None = None
    baseline_entries: int = 0
    unsynced: int | None = None  # pending changes at the last review (None: never reviewed)
    exported: bool = False  # the VM is gone; its unsynced changes wait in the outbox
    ending: str | None = None  # "remove" or "retire": what the background teardown does (lifecycle.finish)
    network: Mode = Mode.ALLOWLIST
    blueprint: str = "base"
    publish: tuple[Publish, ...] = ()
    ssh_agent: bool = False  # the host's ssh-agent is forwarded into the guest (opt-in)
    credentials: list[str] = field(default_factory=list)  # home-relative files `clean` wipes (the blueprint's)
    disk: str | None = None  # the system disk when it is not the session's own overlay (image builds)
    # the workspace disk when it is not the session's own raw disk: a reader VM's qcow2 overlay on the raw disk
    # of a session whose VM is gone (session.diskreader)
    workspace: str | None = None
    # and the raw disk under it, named in the reader's domain so libvirt never hands it to QEMU's account (it
    # would not give a backing file back: the user could no longer read their own disk)
    workspace_backing: str | None = None
    # The qcow2 chain above the image, oldest first, names in the session directory; the VM writes the last.
    # A checkpoint freezes the top one and puts a new one above it (session.checkpoint).
    overlays: list[str] = field(default_factory=lambda: [paths.SESSION_OVERLAY])
    start: str = "cold"  # "warm": restored from a template; "cold": booted (start_note says why)
    start_note: str = ""
    # its guest's `identity` listens on the identity port for a fork's identity (a warm start's, or a fork's, of an
    # image whose guest said so): a fork of it is handed its identity there, without a login (moments.fork)
    identity_port: bool = False
    template: str | None = None  # the warm-start template whose disk the overlay is backed by
    # the memory file the VM maps copy-on-write (a template's memory.ram, the memory.save of the checkpoint it was
    # forked at), sharing the pages it never writes with every session that maps it; None: its memory is its own
    memory: str | None = None
    memory_note: str = ""  # why its memory is its own (a cold boot, a restore of its own save, a host that cannot)
    # the uid (and gid) its QEMU runs as, of its own (confine.pool); None: libvirt's QEMU account, as every session
    # of another account's or on another host
    account: int | None = None
    # the shared image its bottom overlay rests on (a template's disk, an image's), as the host made it: its disks'
    # chain is named from this and `overlays`, never from a header its guest could have written
    below: str | None = None
    memory_limit_mib: int | None = None  # its QEMU's cgroup limit (vm.memory.bound); None: unbounded, the note says why
    memory_limit_note: str = ""
    saved: bool = False  # `vmsandbox stop`: the VM's memory is in the session directory, no domain runs
    stop_note: str = ""  # why it was stopped when not by a person (the memory guard: session.host.memoryguard)
    forked_from: str | None = None  # "NAME" or "NAME@LABEL": the session (and checkpoint) this one is a copy of
    group: str | None = None  # the fan-out this session belongs to (`destroy --group`)
    host: str = "local"  # the libvirt host it runs on (`hosts:`); its URI is libvirt_uri
    remote_port: int = 0  # on another host: the guest's SSH forward on that host's 127.0.0.1 (session.remote.tunnel)
    workspace_bytes: int = 0  # the workspace disk's size as the host made it: copied (or fetched back) no larger

    @property
    def domain(self) -> str:
        return domain_name(self.name)

    @property
    def files(self) -> paths.SessionPaths:
        if self.name.startswith(paths.READER_PREFIX):  # a reader VM (diskreader): its own kind of name
            return paths.reader_paths(self.name)
        return paths.session_paths(self.name)

    @property
    def system_disk(self) -> Path:
        """The disk the VM boots and writes."""
        return Path(self.disk) if self.disk else self.files.root / self.overlays[-1]

    @property
    def workspace_disk(self) -> Path:
        return Path(self.workspace) if self.workspace else self.files.workspace_disk

    @property
    def workspace_backing_disk(self) -> Path | None:
        """A reader's raw disk under its overlay, named in its domain (None: libvirt probes the chain)."""
        return Path(self.workspace_backing) if self.workspace_backing else None

    @property
    def workspace_format(self) -> str:
        return "qcow2" if self.workspace else "raw"

    def endpoint(self, user: str | None = None) -> Endpoint:
        return Endpoint(self.name, self.ssh_port, user or self.user, self.files, self.ssh_agent)

    def target(self) -> Target:
        """What sync needs of this session."""
        return Target(self.name, Path(self.project), self.files, self.uid, self.gid, self.saved)

    @property
    def wants_daemon(self) -> bool:
        """Whether the session's proxy daemon should run: for egress, or to serve published ports."""
        return self.network.has_door or bool(self.publish)

    def owner_alive(self) -> bool:
        return self.owner_pid is not None and pids.process_start(self.owner_pid) == self.owner_start

    def save(self) -> None:
        """Write what this record changed since it was read or last saved, over what its file says now, and then
        the copy (each atomically: one of them is whole whatever happens). Two commands that each hold the record
        for a while (a checkpoint its overlays, `port publish` its ports, a boot its port) never write back what
        the other changed meanwhile; what the other changed is taken in here too. A field both changed: the last
        save's. Saves of one session are one at a time (an flock of their own, held for the read and the write)."""
        mine = self._plain()
        with recordfile.saving(self.files, self.name):
            now, seen = _plain_of(self.files.record), getattr(self, "_seen", None)
            data, theirs = mine, None  # the first save, or over a file that is damaged: all of it
            if now is not None and seen is not None:
                if "created" in now and now["created"] != seen.get("created"):
                    raise VmsandboxError(
                        f"session {self.name} was removed, and another made with its name, while this command ran",
                        hint="`vmsandbox ls` shows it; this command changed nothing of it",
                    )
                data = now | {k: v for k, v in mine.items() if seen.get(k, _UNSEEN) != v}
                theirs = Record._parse(json.dumps(data))  # (each field valid: a whole record's, theirs or mine)
            text = json.dumps(data, indent=2, sort_keys=True) + "\n"
            filewrite.write_atomically(self.files.record, text)
            filewrite.write_atomically(recordfile.copy_of(self.files.record), text)
        if theirs is not None:  # (once written: a save that failed takes in nothing)
            for key in data.keys() & mine.keys():
                if data[key] != mine[key]:
                    setattr(self, key, getattr(theirs, key))
        self._seen = self._plain()

    def _plain(self) -> dict[str, Any]:
        """The record as its file holds it (JSON's own values)."""
        data = asdict(self)
        data["publish"] = [p.as_dict() for p in self.publish]
        return dict(json.loads(json.dumps(data)))

    @classmethod
    def load(cls, name: str) -> Record:
        """The session `name`, the one way every command and front end opens a session by name: a valid name
        (paths.session_paths), a real directory of this account's sessions directory (no symlink), whose record
        names that same session. From its copy (and mended) when the record itself is damaged."""
        files = paths.session_paths(name)
        try:
            real = stat.S_ISDIR(os.lstat(files.root).st_mode)
        except FileNotFoundError:
            real = False
        if not real:
            raise VmsandboxError(f"no session named {name!r}", hint="list sessions with `vmsandbox ls`")
        record_file = files.record
        try:
            record = cls._read(record_file)
        except FileNotFoundError:
            raise VmsandboxError(f"no session named {name!r}", hint="list sessions with `vmsandbox ls`") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # (not a JSON object: AttributeError)
            damage = exc
        else:
            if record.name != name:
                raise VmsandboxError(
                    f"the record in {files.root} names another session ({record.name!r})",
                    hint=f"`vmsandbox rm {name} --discard` removes the directory",
                )
            return record
        try:
            record = cls._read(recordfile.copy_of(record_file))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            raise VmsandboxError(
                f"the record of session {name} ({record_file}) is damaged, and so is its copy: {damage}",
                hint=f"its VM and workspace disk are left as they are; `vmsandbox rm {name} --discard` removes "
                "them (with any unsynced work in them)",
            ) from damage
        if record.name != name:
            raise VmsandboxError(
                f"the record in {files.root} names another session ({record.name!r})",
                hint=f"`vmsandbox rm {name} --discard` removes the directory",
            )
        record.save()  # mended from the copy
        return record

    @classmethod
    def _read(cls, path: Path) -> Record:
        """The record in file `path`, which remembers what it read (its save writes only what changed since)."""
        record = cls._parse(recordfile.read_text(path))
        record._seen = record._plain()  # (as this version reads it: a field it fills in is not a change of its own)
        return record

    @classmethod
    def _parse(cls, text: str) -> Record:
        """The record in `text`, every field checked against its type (pydantic); keys it does not know are
        left out (a newer vmsandbox's). A damaged one raises ValueError naming every field that is wrong."""
        from pydantic import ValidationError

        try:
            record: Record = _adapter().validate_json(text)
        except ValidationError as exc:
            said = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the record'}: {e['msg']}" for e in exc.errors())
            raise ValueError(said) from None
        return record


@functools.cache
def _adapter() -> Any:
    """The record's pydantic validator, made once (and pydantic imported only when a record is read)."""
    from pydantic import TypeAdapter

    return TypeAdapter(Record)


_UNSEEN = object()  # a key the record's file did not have when it was read


def _plain_of(record_file: Path) -> dict[str, Any] | None:
    """What a record's file says now, as JSON's values (None: no file, or a damaged one)."""
    try:
        data = json.loads(recordfile.read_text(record_file))
        Record._parse(json.dumps(data))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return data if isinstance(data, dict) else None


def validate_name(name: str) -> str:
    paths.session_paths(name)  # (the one check of a name)
    return name


def default_name(project: Path) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", project.name.lower()).strip("-")[:20] or "session"
    return f"{stem}-{secrets.token_hex(2)}"


def names() -> list[str]:
    """The sessions of this account: the directories of its sessions directory that bear a session's name
    (a fan-out's capture, or anything else found there, is not one)."""
    root = paths.sessions_dir()
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if paths.is_session_name(d.name) and d.is_dir() and not d.is_symlink())


def orphaned(root: Path, mine: Path) -> bool:
    """A session directory of this machine's sessions directory (`mine`), without its record (gone)."""
    return root.parent.resolve() == mine and not (root / paths.SESSION_RECORD).exists()


def readable() -> Iterator[Record]:
    """Every session's record that can be read (a damaged one is `ls`'s and `gc`'s to report)."""
    for name in names():
        try:
            yield Record.load(name)
        except VmsandboxError:
            continue
