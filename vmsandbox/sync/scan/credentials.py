"""Credentials, both ways: what looks like one in the project before it goes into the VM, and in what the
guest sends back.

The scanner is detect-secrets (Yelp's: regular expressions for the known token formats, keyword and entropy
rules with its false-positive filters), run in its own process (worker.py); over the guest's contents that
process is jailed like every parser of guest bytes. A finding names the rule and the line, never the value.
The session's placeholders (`vmsandbox-placeholder-…`, what the guest sees instead of a real key) are not
credentials and are not flagged, whichever session made them.

Going in, the file names that hold credentials by their nature (keys, `.env`, cloud and package-manager
credential files) are named too, whatever their content.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import pickletools
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import vmsandbox
from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.confine.jail import Jail
from vmsandbox.errors import VmsandboxError

PLACEHOLDER = re.compile(r"vmsandbox-placeholder-[0-9a-f]{32}")
# A line that could hold a credential: a word of the keyword family or a run of 16 token characters (every
# detect-secrets plugin's pattern needs one or the other). The scanner (scanworker.py) reads only such lines.
CANDIDATE = re.compile(
    rb"(?i)key|secret|token|passw|pwd|auth|credential|private|bearer|api|sig|session|cookie|://|[A-Za-z0-9+/=_-]{16}"
)
SCAN_LIMIT = 512 * 1024  # larger files are not scanned (generated data, not a config a token is pasted into)
BATCH_BYTES = 16 * 1024**2  # contents per scanner process (its /tmp holds them: jail.TMP_BYTES)
SCAN_TIMEOUT = 300
# Names that hold credentials by their nature (matched against the file's name, or its path for those with /).
# Not `*.pem`/`*.key`: a certificate is public; a private key in one is found by its content (inbound.py).
CREDENTIAL_NAMES = (
    ".env", ".env.*", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "id_rsa", "id_dsa",
    "id_ecdsa", "id_ed25519", ".netrc", ".npmrc", ".pypirc", ".git-credentials", "*.tfvars", "*.tfstate",
    "credentials.json", "service-account*.json", ".aws/credentials", ".docker/config.json", ".kube/config",
    "*.ovpn", "secrets.yaml", "secrets.yml",
)  # fmt: skip
NOT_CREDENTIALS = (".env.example", ".env.sample", ".env.template", ".env.dist")


@dataclass(frozen=True)
class Finding:
    path: str
    what: str  # the rule: "GitHub Token", "Secret Keyword", "a private key's file name", …
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.what} (line {self.line})" if self.line else self.what


def by_name(path: str) -> Finding | None:
    name = path.rsplit("/", 1)[-1]
    if name in NOT_CREDENTIALS:
        return None
    for pattern in CREDENTIAL_NAMES:
        subject = path if "/" in pattern else name
        if fnmatch.fnmatchcase(subject, pattern) or ("/" in pattern and subject.endswith("/" + pattern)):
            return Finding(path, f"a credential file's name ({pattern})")
    return None


def worker_jail() -> Jail:
    """What the scanner's Python needs to read: its environment and the vmsandbox package; nothing else."""
    package = Path(vmsandbox.__file__).resolve().parent
    tops = {Path(sys.prefix), Path(sys.base_prefix), package, *(Path(p) for p in sys.path if p.endswith("-packages"))}
    return Jail(readable=tuple(sorted(p for p in tops if p.is_dir())))


# A content that might be a pickle naming code, as far as its first byte tells without parsing: one the unpickler
# takes as an opcode (no header is needed: a protocol-4 stream without its PROTO byte loads as well). Those go to
# the scanner process, which loads them with a find_class that stops at the first name (worker.loads_code).
PICKLE_OPCODES = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes)
PICKLE_LIMIT = 16 * 1024**2  # contents looked at whole; a larger one starting like a pickle is held unread
PICKLE = "a pickle that names code (loading it runs that code)"
UNREAD_PICKLE = f"starts like a pickle and is larger than the {PICKLE_LIMIT // 1024**2} MiB looked at"


def may_be_pickle(content: bytes) -> bool:
    return bool(content) and content[0] in PICKLE_OPCODES


@dataclass
class Scanned:
    findings: dict[str, list[Finding]]  # per path
    pickles: set[str]  # paths whose content is a pickle that names code


def _run_worker(scan: list[tuple[str, bytes]], pickles: list[tuple[str, bytes]], *, jailed: bool) -> Scanned:
    data = json.dumps(
        {kind: [[name, base64.b64encode(content).decode()] for name, content in batch]
         for kind, batch in (("scan", scan), ("pickles", pickles))}
    )  # fmt: skip
    who = accounts.guest_data_account() if jailed else None
    result = proc.run(
        proc.own_module("vmsandbox.sync.scan.worker"),  # -I: nothing of the cwd or environment
        input=data,
        jail=worker_jail() if jailed else None,
        as_user=who,
        limits=accounts.GIT_LIMITS if jailed else None,
        env=accounts.clean_env(who),
        timeout=SCAN_TIMEOUT,
        check=False,
        hint="is detect-secrets installed (`pip install detect-secrets`)?",
    )
    if result.returncode != 0:
        raise VmsandboxError(
            f"the credential scanner failed: {result.stderr.strip()[-300:]}",
            hint="reinstall vmsandbox with its dependencies (`pip install -e .`), which include detect-secrets",
        )
    answer = json.loads(result.stdout)
    out = Scanned({}, set())
    for index, what, line, value in answer["found"]:
        if 0 <= index < len(scan) and not PLACEHOLDER.search(str(value)):
            out.findings.setdefault(scan[index][0], []).append(
                Finding(scan[index][0], str(what), int(line) if line else None)
            )
    out.pickles = {pickles[i][0] for i in answer["pickles"] if isinstance(i, int) and 0 <= i < len(pickles)}
    return out


def inspect(contents: Mapping[str, bytes], *, jailed: bool, pickles: Mapping[str, bytes] | None = None) -> Scanned:
    """Credential findings per path over `contents` (`jailed` for the guest's), and which of `pickles` are
    pickles that name code; one scanner process per batch, none when no line could hold a credential (the
    scanner's own first test, CANDIDATE) and no content may be a pickle (may_be_pickle)."""
    out = Scanned({}, set())
    todo = [("scan", p, c) for p, c in contents.items() if CANDIDATE.search(c)]
    todo += [("pickles", p, c) for p, c in (pickles or {}).items() if may_be_pickle(c)]
    batch: dict[str, list[tuple[str, bytes]]] = {"scan": [], "pickles": []}
    size = 0
    for n, (kind, path, content) in enumerate(todo):
        batch[kind].append((path, content))
        size += len(content)
        if size > BATCH_BYTES or n == len(todo) - 1:
            got = _run_worker(batch["scan"], batch["pickles"], jailed=jailed)
            for p, f in got.findings.items():
                out.findings.setdefault(p, []).extend(f)
            out.pickles |= got.pickles
            batch, size = {"scan": [], "pickles": []}, 0
    return out


def scan(contents: Mapping[str, bytes], *, jailed: bool) -> dict[str, list[Finding]]:
    """Findings per path over the given contents (inspect, without the pickles)."""
    return inspect(contents, jailed=jailed).findings


def summary(findings: list[Finding]) -> str:
    """One short line for a file's findings: the kinds found and where."""
    unscanned = [f.what for f in findings if f.what.startswith("not scanned")]
    if unscanned:
        return unscanned[0]
    first = sorted(findings, key=lambda f: f.line or 0)[:3]
    more = f" and {len(findings) - 3} more" if len(findings) > 3 else ""
    return "looks like a credential: " + ", ".join(map(str, first)) + more
