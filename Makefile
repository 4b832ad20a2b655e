# The two commands README.md gives for a fresh Debian/Ubuntu machine:
#   make run    set everything up, build the base image if missing, run a sandbox on demo/
#   make test   set everything up, build the base image if missing, run lint, types and all tests
# Both are idempotent: a second run only does what is missing.

SHELL := /bin/bash
.DEFAULT_GOAL := help
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The system's Python where there is one: a venv made from it runs for every account (a pyenv under
# /root would not), so users in the libvirt group can run .venv/bin/vmsandbox without sudo.
PYTHON ?= $(shell [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)
VENV := .venv
VMSANDBOX := $(VENV)/bin/vmsandbox

# Debian packages: QEMU and libvirt (VMs), libvirt-dev/pkg-config/gcc/python3-dev (to build
# libvirt-python), debootstrap/e2fsprogs (the base image), rsync/openssh-client (the workspace), git, bubblewrap
# (the jail of every process that reads guest data), tini (where no service manager runs, libvirtd's reaper).
APT_PACKAGES := qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients libvirt-dev pkg-config \
	gcc python3-dev python3-venv debootstrap e2fsprogs rsync openssh-client git make ca-certificates procps bubblewrap \
	tini
# The tests also play a remote libvirt host on this machine, reached through an sshd they start on 127.0.0.1,
# and drive the web review in the system's Chromium (headless, through chromium-driver); strace shows which files
# root's qemu-img opens, and slows root's look helper where a test races it.
TEST_APT_PACKAGES := openssh-server chromium chromium-driver strace

.PHONY: help setup apt venv host image run test lint unit integration integration-plain bench suite-costs clean

help:
	@echo "make run   - set up this machine, build the base image if missing, run a sandbox on demo/"
	@echo "make test  - set up this machine and run lint, type checks, unit and integration tests"
	@echo "make integration-plain - the integration tests as a plain member of the libvirt group (no sudo)"
	@echo "make bench - the peers' benchmark (bench/peers.py): prints a table, writes docs/benchmarks.md;"
	@echo "             BENCH_ARGS=--quick for a smoke test at tiny sizes. The others, one figure each, by hand:"
	@echo "             sudo .venv/bin/python bench/NAME.py, NAME one of boot, density, experiments, sharing, review,"
	@echo "             sync, hosts, provenance, deadpull, bootstrap"
	@echo "make suite-costs - the integration tests one at a time, with what each costs in CPU (bench/suite.py --serial)"

setup: apt venv host

apt:
	@missing=$$(for p in $(APT_PACKAGES) $(EXTRA_APT); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "Installing: $$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# Byte-compiled once here: where PYTHONDONTWRITEBYTECODE is set (as on CI machines) every `vmsandbox` call would
# otherwise compile the modules it imports from source (measured: 0.45 -> 0.30 CPU s for `vmsandbox ls`).
venv: $(VENV)/.installed
	@$(VENV)/bin/python -m compileall -q vmsandbox tests bench

# What udev and a service manager would do: /dev/kvm group kvm 0660, virtlogd and libvirtd running.
host: venv
	$(SUDO) $(VMSANDBOX) host setup

image: setup
	$(SUDO) $(VMSANDBOX) image build

run: image
	$(SUDO) $(VMSANDBOX) doctor
	$(SUDO) $(VMSANDBOX) run demo -- sh -c 'echo "hello from $$(hostname), kernel $$(uname -r), user $$(id -un)"'

lint: venv
	$(VENV)/bin/ruff check vmsandbox tests bench docs/hooks
	$(VENV)/bin/ruff format --check vmsandbox tests bench docs/hooks
	$(VENV)/bin/mypy

unit: venv
	$(VENV)/bin/python bench/suite.py --only unit

integration: EXTRA_APT := $(TEST_APT_PACKAGES)
integration: image
	$(VENV)/bin/python bench/suite.py --only integration

# lint, unit and integration phases (integration tests in parallel workers), each timed; the run's figures are
# appended to the data directory's suite-runs.jsonl and printed beside the last runs (bench/suite.py).
test: EXTRA_APT := $(TEST_APT_PACKAGES)
test: image
	$(VENV)/bin/python bench/suite.py

# The integration tests as a plain member of the libvirt group, as users without sudo run vmsandbox: the tests
# that need root for what they test (they make accounts, stop libvirtd, build images, mount) are skipped, each
# saying why. The account (PLAIN_USER) is made once; the checkout must be readable by it.
PLAIN_USER ?= vmsandbox-plain
integration-plain: EXTRA_APT := $(TEST_APT_PACKAGES)
integration-plain: image
	id -u $(PLAIN_USER) >/dev/null 2>&1 || $(SUDO) useradd --create-home --shell /bin/sh -G libvirt $(PLAIN_USER)
	$(SUDO) runuser -u $(PLAIN_USER) -- env -i PATH=/usr/bin:/bin LANG=C.UTF-8 \
		HOME="$$(getent passwd $(PLAIN_USER) | cut -d: -f6)" PYTHONDONTWRITEBYTECODE=1 \
		VMSANDBOX_TEST_LOCKS=/var/tmp/$(PLAIN_USER)-locks VMSANDBOX_TEST_LOGS=/var/tmp/$(PLAIN_USER)-logs \
		$(VENV)/bin/python bench/suite.py --only integration

# The figures peers publish (create, resume, fork, memory a session, density, review), measured here and written
# to docs/benchmarks.md beside theirs (bench/peers.py; BENCH_ARGS=--quick runs it at tiny sizes).
bench: image
	$(SUDO) $(VENV)/bin/python bench/peers.py $(BENCH_ARGS)

suite-costs: EXTRA_APT := $(TEST_APT_PACKAGES)
suite-costs: image
	$(VENV)/bin/python bench/suite.py --serial --only integration

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
