# Tianji: `make demo` and `make test` each set everything up on a fresh Debian 12 machine (as root), then run.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
APT_PKGS := openvswitch-switch mininet iproute2 ethtool iputils-ping traceroute iperf3 tcpdump python3-venv python3-dev nftables \
            gcc make pkg-config isc-dhcp-client busybox netcat-openbsd curl jq postgresql-client procps \
            libdpdk-dev libxdp-dev libbpf-dev clang frr chromium \
            qemu-system-x86 podman runc containernetworking-plugins util-linux libvirt-daemon-system libvirt-clients \
            openvswitch-switch-dpdk
VENV_STAMP := $(VENV)/.installed

.PHONY: setup apt venv native guests demo test upgrade-test test-unit test-api test-integration lint bench bench-gateway bench-nat-new bench-scale clean

setup: apt venv native guests

apt:
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "==> installing Debian packages: $$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	else echo "==> Debian packages: all present"; fi

venv: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml
	@echo "==> virtualenv $(VENV) (system site packages, so Debian's Mininet is importable)"
	@[ -x $(PY) ] || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	@$(PY) -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -m pip install -q -e '.[test]' 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -c "import controller, fastapi, os_ken, pyroute2, scapy" && touch $@

# real guests: the KVM guest image (a Debian kernel and busybox-static, from Debian's archive, cached), the CNI
# plugin where runtimes look for plugins, and podman's configuration for this machine (containers.conf)
guests: venv
	@$(PY) -m topologies.guest_image
	@mkdir -p /opt/cni/bin && ln -sf $(abspath $(VENV))/bin/tianji-cni /opt/cni/bin/tianji-cni
	@$(PY) -m topologies.podman_setup

# the gateway's native code, compiled on this machine (never shipped prebuilt); quick when up to date
native: venv
	@$(PY) -m nfv_gateways.build

demo: setup
	@$(PY) -m topologies.demo $(DEMO_ARGS)

test: setup
	@bash scripts/run-tests.sh

# a rolling upgrade from the previous release (topologies/releases.py, installed once) under traffic
upgrade-test: setup
	@$(PY) -m pytest -q -s -p no:cacheprovider tests/upgrade

test-unit: setup
	@$(PY) -m pytest -q tests/unit

lint: setup
	@$(VENV)/bin/ruff check .

bench: setup
	@$(PY) bench/control_plane.py

bench-gateway: setup
	@$(PY) bench/gateway.py

bench-nat-new: setup
	@$(PY) bench/nat_wire.py

bench-scale: setup
	@$(PY) bench/scale.py
	@$(PY) bench/gateway.py --scale 100,1000

clean:
	rm -rf $(VENV) *.egg-info
