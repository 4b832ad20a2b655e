from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox import trust
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import blueprint
from vmsandbox.session import settingrows, settings
from vmsandbox.vm.accel import Accel


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_project_overrides_user_and_env_overrides_both(
    tmp_path: Path, isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(isolated_dirs / "config" / "config.yaml", "cpus: 3\nmemory: 1G\naccel: kvm\n")
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "memory: 3072M\n")
    monkeypatch.setenv("VMSANDBOX_ACCEL", "tcg")
    s = settings.load(project)
    assert (s.cpus, s.memory_mib, s.accel) == (3, 3072, Accel.TCG)


def test_vmsandbox_cpus_overrides_the_files_and_is_checked(
    tmp_path: Path, isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(isolated_dirs / "config" / "config.yaml", "cpus: 2\n")
    monkeypatch.setattr(settingrows, "host_cpus", lambda: 4)
    monkeypatch.setenv("VMSANDBOX_CPUS", "1")
    assert settings.load().cpus == 1
    assert settings.layers(None)[-1].source == "VMSANDBOX_CPUS"
    for bad, said in (("two", "not a number"), ("9", "between 1 and 4"), ("0", "between 1 and 4")):
        monkeypatch.setenv("VMSANDBOX_CPUS", bad)
        with pytest.raises(VmsandboxError) as err:
            settings.load()
        assert said in err.value.message and "VMSANDBOX_CPUS" in err.value.message


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    f = write(tmp_path / "proj" / ".vmsandbox.yaml", "cpu: 4\n")
    with pytest.raises(VmsandboxError) as err:
        settings.load(tmp_path / "proj")
    assert str(f) in err.value.message
    assert "`cpu`" in err.value.message
    assert err.value.hint is not None and "cpus" in err.value.hint


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("cpus: four\n", "`cpus` must be an integer"),
        ("trust_host_ca: 1\n", "true or false"),
        ("memory: lots\n", "cannot read size"),
        ("accel: xen\n", "unknown accelerator"),
        ("cpus: 0\n", "between"),
        ("memory: 2\n", "too small"),  # 2 MiB: a plain number is MiB, and no guest boots in that
        ("memory: 128M\n", "too small"),
        ("disk: 1G\n", "too small"),
        ("boot_timeout: -5\n", "between 1 and 3600"),
        ("cpus: 4096\n", "the host's CPUs"),
        ("memory: [1]\n", "a size like 2G"),
        ("cpus: 2\nmemory: 2G\ncpus: 4\n", "line 3.*`cpus` is given twice"),
    ],
)
def test_bad_values_are_errors(tmp_path: Path, text: str, needle: str) -> None:
    write(tmp_path / "p" / ".vmsandbox.yaml", text)
    with pytest.raises(VmsandboxError, match=needle):
        settings.load(tmp_path / "p")


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    write(tmp_path / "p" / ".vmsandbox.yaml", "- a\n- b\n")
    with pytest.raises(VmsandboxError, match="mapping"):
        settings.load(tmp_path / "p")
    write(tmp_path / "p" / ".vmsandbox.yaml", "cpus: [\n")
    with pytest.raises(VmsandboxError, match="not valid YAML"):
        settings.load(tmp_path / "p")


@pytest.mark.parametrize(
    ("text", "mib"), [("2G", 2048), ("512", 512), ("1536M", 1536), ("1GiB", 1024), ("1T", 1024 * 1024)]
)
def test_sizes(text: str, mib: int) -> None:
    assert settingrows.parse_size_mib(text, what="x") == mib


def test_a_size_may_be_a_plain_number_of_mib(tmp_path: Path) -> None:
    write(tmp_path / "p" / ".vmsandbox.yaml", "memory: 2048\ndisk: 30720\n")
    s = settings.load(tmp_path / "p")
    assert (s.memory_mib, s.disk_mib) == (2048, 30720)


def test_network_settings_accumulate_across_sources(tmp_path: Path, isolated_dirs: Path) -> None:
    write(isolated_dirs / "config" / "config.yaml", "allow: ['*.example.org']\nallow_networks: [203.0.113.0/24]\n")
    project = tmp_path / "proj"
    write(
        project / ".vmsandbox.yaml",
        "network: open\nallow: [api.example.com:8443]\nsecrets:\n"
        "  - {secret: k, host: API.example.com, header: Authorization, value: 'Bearer {secret}', env: K}\n",
    )
    trust.trust(project / ".vmsandbox.yaml", (project / ".vmsandbox.yaml").read_bytes())
    s = settings.load(project, blueprint=blueprint.load("base")).merged(
        {"allow": ["x.example.net"]}, settings.COMMAND_LINE
    )
    assert s.network.value == "open"
    assert {"*.example.org", "api.example.com:8443", "x.example.net", "pypi.org"} <= set(s.allow)
    assert s.allow_networks == ("203.0.113.0/24",)
    (m,) = s.secrets
    assert (m.secret, m.host, m.header, m.value, m.env, m.required) == (
        "k",
        "api.example.com",
        "Authorization",
        "Bearer {secret}",
        "K",
        True,
    )


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("{secret: k, host: a.com}", "missing key `header`"),
        ("{secret: k, host: a.com, header: x, hdr: y}", "unknown key `hdr`"),
        ("{secret: k, host: 10.0.0.1, header: x}", "`host`"),
        ("{secret: k, host: a.com, header: 'x y'}", "`header`"),
        ("{secret: k, host: a.com, header: x, value: 'Bearer'}", "`value`"),
        ("{secret: k, host: a.com, header: x, env: '1X'}", "`env`"),
        ("{secret: '../k', host: a.com, header: x}", "secret name"),
    ],
)
def test_bad_secret_mappings_name_the_key(tmp_path: Path, entry: str, needle: str) -> None:
    f = write(tmp_path / "proj" / ".vmsandbox.yaml", f"secrets:\n  - {entry}\n")
    with pytest.raises(VmsandboxError) as err:
        settings.load(tmp_path / "proj")
    assert needle in err.value.message
    if "name" not in needle:
        assert str(f) in err.value.message and "secrets[0]" in err.value.message


def test_a_project_file_that_widens_needs_trust_and_sizing_does_not(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "cpus: 4\nmemory: 4G\nboot_timeout: 60\n")
    assert settings.load(project).cpus == 4  # sizing keys need no trust
    write(project / ".vmsandbox.yaml", "cpus: 4\nnetwork: open\nallow: [evil.example]\n")
    with pytest.raises(trust.UntrustedError) as exc:
        settings.load(project)
    assert "`allow`, `network`" in exc.value.message and "vmsandbox config trust add" in (exc.value.hint or "")
    trust.trust(project / ".vmsandbox.yaml", (project / ".vmsandbox.yaml").read_bytes())
    assert settings.load(project).network.value == "open"
    write(project / ".vmsandbox.yaml", "cpus: 4\nnetwork: open\nallow: [evil.example, worse.example]\n")
    with pytest.raises(trust.UntrustedError, match="changed since you trusted it"):
        settings.load(project)


def test_trust_lives_outside_the_project(tmp_path: Path, isolated_dirs: Path) -> None:
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "network: open\n")
    trust.trust(project / ".vmsandbox.yaml", (project / ".vmsandbox.yaml").read_bytes())
    store = isolated_dirs / "config" / trust.TRUST_FILE
    assert store.exists() and store.stat().st_mode & 0o077 == 0
    assert not list(project.glob("*trust*"))


def test_libvirt_uri_never_comes_from_a_project(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "libvirt_uri: 'qemu+ext:///system?command=/tmp/x'\n")
    with pytest.raises(VmsandboxError, match="`libvirt_uri` is never taken from a project file"):
        settings.load(project)


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("qemu+ext:///system?command=/tmp/x", "is not a libvirt QEMU URI"),
        ("qemu+tcp://lab/system", "neither encrypts nor authenticates"),
        ("qemu+ssh://lab/system?no_verify=1", "turns off the check of the host's SSH key"),
        ("qemu+libssh://lab/system?known_hosts_verify=ignore", "turns off the check of the host's SSH key"),
        ("xen:///system", "is not a libvirt QEMU URI"),
    ],
)
def test_libvirt_uri_follows_the_rules_of_hosts_uris(
    uri: str, needle: str, isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's own `libvirt_uri` (and VMSANDBOX_LIBVIRT_URI) is held to what `hosts:` URIs follow: no
    transport that runs a program, none that skips authentication or the host key check."""
    write(isolated_dirs / "config" / "config.yaml", f"libvirt_uri: '{uri}'\n")
    with pytest.raises(VmsandboxError, match=needle) as err:
        settings.load()
    assert "libvirt_uri" in err.value.message
    (isolated_dirs / "config" / "config.yaml").unlink()
    monkeypatch.setenv("VMSANDBOX_LIBVIRT_URI", uri)
    with pytest.raises(VmsandboxError, match=needle):
        settings.load()
    monkeypatch.setenv("VMSANDBOX_LIBVIRT_URI", "qemu+ssh://me@lab/system?keyfile=/k")
    assert settings.load().libvirt_uri == "qemu+ssh://me@lab/system?keyfile=/k"


def test_a_project_file_sizing_past_the_host_needs_trust(tmp_path: Path) -> None:
    """Sizing needs no trust up to a ceiling: a cloned repository asking for more than half the host's memory
    or a disk larger than the free space is untrusted until `vmsandbox config trust`."""
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "memory: 16G\ndisk: 400G\n")
    assert (settings.load(project).memory_mib, settings.load(project).disk_mib) == (16 * 1024, 400 * 1024)
    write(project / ".vmsandbox.yaml", "memory: 4096G\ndisk: 600G\ncpus: 2\n")
    with pytest.raises(trust.UntrustedError) as exc:
        settings.load(project)
    assert "`disk`, `memory`" in exc.value.message
    trust.trust(project / ".vmsandbox.yaml", (project / ".vmsandbox.yaml").read_bytes())
    assert settings.load(project).memory_mib == 4096 * 1024  # the user said so


def test_a_symlinked_project_file_is_refused(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    write(tmp_path / "elsewhere.yaml", "cpus: 2\n")
    project.mkdir()
    (project / ".vmsandbox.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    with pytest.raises(VmsandboxError, match="is a symlink"):
        settings.load(project)


def test_yaml_errors_name_the_file_and_line(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "cpus: 2\nmemory: [\n")
    with pytest.raises(VmsandboxError, match=r"\.vmsandbox\.yaml, line \d+, column \d+: not valid YAML"):
        settings.load(project)


# Issue 46: every problem of a config file in one round, each at its own line with its own hint.

BROKEN = """\
cpus: 2
memory: 2G
cpus: 40
network: alowlist
accel: kmv
allow: [pypi.org, "http://bad"]
hosts:
  - name: big
    uri: qemu+ssh://me@big/system
  - name: small
    uri: qemu+ssh://me@small/system
    keep_free: 1G
    colour: red
mass_change_size: lots
"""


def test_every_problem_of_a_config_in_one_round_each_at_its_line_with_its_hint(isolated_dirs: Path) -> None:
    """A key given twice hides nothing else; a nested key is said at its own line (13, not `hosts:`'s 7); a
    name expected gets a "did you mean"; each hint is on a line of its own, under its problem."""
    f = write(isolated_dirs / "config" / "config.yaml", BROKEN)
    with pytest.raises(VmsandboxError) as err:
        settings.load()
    lines = err.value.message.splitlines()
    assert lines[0] == f"{f}: 7 problems:"
    said = [line.strip() for line in lines[1:]]
    assert said == [
        "line 3: the key `cpus` is given twice (first on line 1)",
        "hint: keep one of them",
        "line 3: `cpus` must be between 1 and 16 (the host's CPUs)",
        "hint: more vCPUs than the host has only makes the guest slower",
        "line 4: `network`: unknown network mode 'alowlist' (did you mean `allowlist`?)",
        "hint: use allowlist, open or none",
        "line 5: `accel`: unknown accelerator 'kmv' (did you mean `kvm`?)",
        "hint: use auto, kvm or tcg",
        "line 6: `allow[1]`: 'http://bad' is a URL, not a host name",
        "hint: write bad",
        "line 13: `hosts[1]`: unknown key `colour`",
        "hint: `hosts[1]` takes: name, uri, max_sessions, keep_free, pool_path",
        "line 14: `mass_change_size`: cannot read size 'lots'",
        "hint: write it like 2G or 2048M",
    ]
    assert err.value.hint is None  # not joined into one line: each is under its own problem


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        ("cpus: 2\nmemory: [\n", 2, "the end of the file"),  # PyYAML's mark is on line 3, past the file
        ("cpus: 2\nmemory: [\n\n# a comment\n", 2, "the end of the file"),
        ('cpus: 2\nmemory: "2G\nboot_timeout: 5\n', 2, "while scanning a quoted scalar"),  # the quote's line
        ("cpus: 2\nmemory\nboot_timeout: 5\n", 2, "could not find expected ':'"),  # the key's line, not the next
        ("cpus: 2\n  memory: 2G\n", 2, "mapping values are not allowed here"),
        ("cpus: 2\nallow:\n  - a.com\n  memory: 2G\n", 4, "expected <block end>"),
        ("hosts:\n\t- name: a\n", 2, "'\\t'"),
    ],
)
def test_a_yaml_syntax_error_is_said_at_the_line_that_holds_it(tmp_path: Path, text: str, line: int, said: str) -> None:
    f = write(tmp_path / "config.yaml", text)
    with pytest.raises(VmsandboxError) as err:
        settings.read_file(f, settings.Settings())
    assert err.value.message.startswith(f"{f}, line {line}, column ")
    assert "not valid YAML" in err.value.message and said in err.value.message
    assert err.value.hint is not None


def test_a_key_given_twice_is_said_beside_every_other_problem(tmp_path: Path) -> None:
    text = "memory: 2G\nsecrets:\n  - secret: k\n    secret: j\n    host: a.com\nmemroy: 1G\n"
    f = write(tmp_path / "config.yaml", text)
    with pytest.raises(VmsandboxError) as err:
        settings.read_file(f, settings.Settings())
    message = err.value.message
    assert f"{f}: 3 problems:" in message
    assert "line 4: `secrets[0]`: the key `secret` is given twice (first on line 3)" in message
    assert "line 3: `secrets[0]`: missing key `header`" in message  # the entry's line
    assert "line 6: unknown key `memroy` (did you mean `memory`?)" in message


def test_a_nested_key_in_a_secret_is_said_at_its_own_line(tmp_path: Path) -> None:
    f = write(
        tmp_path / "config.yaml",
        "cpus: 2\nsecrets:\n  - secret: k\n    host: 10.0.0.1\n    header: x\n  - secret: j\n"
        "    host: b.com\n    header: 'x y'\n",
    )
    with pytest.raises(VmsandboxError) as err:
        settings.read_file(f, settings.Settings())
    assert "line 4: `secrets[0]`: `host`: IP literals are not allowed" in err.value.message
    assert "line 8: `secrets[1]`: `header` 'x y' is not a header name" in err.value.message


def test_a_broken_config_is_read_as_far_as_it_passes(isolated_dirs: Path, tmp_path: Path) -> None:
    """What a diagnostic goes on with (ls, doctor, config show): every key that passes, the problems beside."""
    write(isolated_dirs / "config" / "config.yaml", "memory: 3G\ncpus: 99\nallow: [a.example, 'http://b']\n")
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "disk: 30G\nboot_timeout: [\n")
    loaded, broken = settings.load_lenient(project)
    assert (loaded.memory_mib, loaded.cpus, loaded.allow) == (3072, 2, ())  # a refused key left out whole
    assert [type(e).__name__ for e in broken] == ["FileError", "FileError"]
    assert "2 problems" in broken[0].message and "not valid YAML" in broken[1].message
    with pytest.raises(VmsandboxError):  # what a session reads: refused whole
        settings.load(project)


def test_an_untrusted_project_file_is_left_out_of_a_lenient_read(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    write(project / ".vmsandbox.yaml", "network: open\n")
    loaded, broken = settings.load_lenient(project)
    assert loaded.network.value == "allowlist"
    (untrusted,) = broken
    assert isinstance(untrusted, trust.UntrustedError)


def test_a_project_file_is_refused_machine_keys_beside_its_other_problems(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    f = write(project / ".vmsandbox.yaml", "hosts: []\ncpus: 0\nlibvirt_uri: qemu:///system\n")
    with pytest.raises(VmsandboxError) as err:
        settings.load(project)
    message = err.value.message
    assert f"{f}: 3 problems:" in message
    for said in ("line 1: `hosts` is never taken", "line 2: `cpus` must be between", "line 3: `libvirt_uri` is never"):
        assert said in message, said


def test_the_settings_rows_are_named_as_the_keys_are_written() -> None:
    """`config show` named a row `mass_change_size_mib` where the key is `mass_change_size`."""
    import dataclasses

    assert {settingrows.key_of(f.name) for f in dataclasses.fields(settings.Settings)} == set(settingrows.FIELDS)
