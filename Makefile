# Each target does its own set-up and first checks what it needs on the machine
# (infra/dev/prereqs.sh: one line naming what to install, nothing installed behind your back):
# any Python 3.11-3.13, Java 17+ and Maven; for the tests also Go 1.23+ (toxiproxy and
# ec2-metadata-mock are built from the Go module proxy) and promtool; Go 1.26+ for helm-check.
# PY: the first of python3, python3.13, python3.12, python3.11 on the PATH that is 3.11-3.13.
ifeq ($(origin PY),undefined)
PY      := $(shell for p in python3 python3.13 python3.12 python3.11; do \
             $$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
             >/dev/null 2>&1 && { echo $$p; break; }; done)
endif
PREREQS := infra/dev/prereqs.sh
# The oldest Go the pinned modules build with (go.mod of ec2-metadata-mock v1.13.0: 1.23;
# helm v3.22.0, kubeconform v0.8.0, controller-gen v0.23.0: 1.26).
GO_TEST_MIN := 1.23
GO_HELM_MIN := 1.26
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
JARS    := .kafka/libs/.fetched
# toxiproxy, the TCP proxy the network fault test puts between Kafka and its clients.
TOXIPROXY_VERSION := v2.5.0
TOXIPROXY_BUILD   := .tools/toxiproxy-$(TOXIPROXY_VERSION)/server
TOXIPROXY         := .tools/toxiproxy-server
# amazon-ec2-metadata-mock, AWS's simulator of the EC2 instance metadata service (spot
# interruptions, rebalance recommendations, IMDSv2) that the capacity agent's tests run against.
AEMM_VERSION := v1.13.0
AEMM_BUILD   := .tools/ec2-metadata-mock-$(AEMM_VERSION)/ec2-metadata-mock
AEMM         := .tools/ec2-metadata-mock
# uv resolves requirements.lock (`make lock`); installed from PyPI into .tools/.
UV_VERSION := 0.13.8
UV         := .tools/uv-$(UV_VERSION)/bin/uv
# torch: PyPI's Linux build is the CUDA one (with the nvidia-* libraries it links against, 5.2 GB
# of the venv). Where no NVIDIA GPU answers nvidia-smi, `make setup` first takes the CPU build of
# the locked version from PyTorch's own index, and PyPI's where that index cannot be reached
# (`make setup TORCH_CPU_INDEX=` skips the attempt).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_VERSION   := $(shell sed -n 's/^torch==\([^ ]*\).*/\1/p' requirements.lock)
# promtool lints /metrics and tests the alert rules; `make promtool` checks there is one (Debian:
# `apt install prometheus`; with SURPLUS_INSTALL_SYSTEM_PACKAGES=1, as .ci/run sets, it installs it).
PROMTOOL ?= promtool
# The Helm chart's checks (`make helm-check`): helm and kubeconform from the Go module proxy;
# the schemas kubeconform reads are laid out offline in .tools/ from kubernetes-validate's
# wheel (PyPI: Kubernetes' JSON schemas) and from the CRDs controller-gen makes of the
# prometheus-operator API module (infra/helm/crds pins it).
HELM_VERSION           := v3.22.0
HELM                   := .tools/helm-$(HELM_VERSION)/helm
KUBECONFORM_VERSION    := v0.8.0
KUBECONFORM            := .tools/kubeconform-$(KUBECONFORM_VERSION)/kubeconform
CONTROLLER_GEN_VERSION := v0.23.0
CONTROLLER_GEN         := .tools/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
K8S_SCHEMAS_VERSION    := 1.37.0
K8S_SCHEMAS            := .tools/kubeconform-schemas-$(K8S_SCHEMAS_VERSION)
# The oldest Kubernetes the chart allows (Chart.yaml kubeVersion) and the newest with schemas.
HELM_KUBE_VERSIONS     := 1.29.0 1.37.0
CHART                  := infra/helm/surplus

.PHONY: test test-fast test-faults test-gpu lint demo soak bench clean setup compose-check toxiproxy ec2-metadata-mock lock \
        test-client-install promtool kcat test-alerts helm-check docs prereqs test-wheel mlserver

setup: $(STAMP) $(JARS)

# Everything `make test` needs on the machine, each missing piece named (nothing installed).
prereqs:
	@$(PREREQS) python "$(PY)" java mvn go $(GO_TEST_MIN) promtool $(PROMTOOL)
	@echo "prerequisites: $(PY) ($$($(PY) --version 2>&1)), java, mvn, go, $(PROMTOOL) found"

# Every extra plus the test and docs tools (PEP 735 groups), at the versions requirements.lock
# pins, installed by uv: it links the files from its cache instead of unpacking each wheel
# again, so a second virtualenv (CI's other Python, `.venv-other`) takes seconds, not the
# minutes pip spends on torch's 6 GB. The venv keeps its own pip for those who use it.
$(STAMP): pyproject.toml requirements.lock | $(UV)
	@test -x $(BIN)/python || $(PREREQS) python "$(PY)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@if [ -n "$(TORCH_CPU_INDEX)" ] && ! nvidia-smi -L >/dev/null 2>&1 \
	    && ! $(BIN)/python -c 'import torch' >/dev/null 2>&1; then \
	  echo "no NVIDIA GPU: torch $(TORCH_VERSION), CPU build, from $(TORCH_CPU_INDEX)"; \
	  UV_HTTP_TIMEOUT=20 $(UV) pip install -q --python $(BIN)/python --no-deps \
	    --index-url $(TORCH_CPU_INDEX) "torch==$(TORCH_VERSION)" \
	  || echo "$(TORCH_CPU_INDEX) did not serve it: PyPI's torch, the CUDA build, run on the CPU"; fi
	$(UV) pip install -q --python $(BIN)/python -c requirements.lock -e '.[all]' \
	  --group test --group docs
	touch $(STAMP)

# Re-resolve requirements.lock after a change to pyproject's ranges; pins already in it are kept
# (UPGRADE=--upgrade takes the newest versions the ranges allow).
lock: $(UV)
	$(UV) pip compile pyproject.toml --extra all --group test --group docs --python-version 3.11 \
	  --python-platform x86_64-unknown-linux-gnu --annotation-style line \
	  --custom-compile-command "make lock" $(UPGRADE) -o requirements.lock

# With the venv's pip (a Debian python3 has none of its own), not waiting for the install.
$(UV):
	@test -x $(BIN)/python || $(PREREQS) python "$(PY)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --target .tools/uv-$(UV_VERSION) uv==$(UV_VERSION)

# A fresh venv with only surplus[client] imports and uses the client (~20 s).
test-client-install: $(STAMP)
	$(BIN)/pytest -q -s tests/packaging

# The wheel of this checkout (its version from git) installs into a clean venv with each extra,
# passes pip check and imports what the extra is for (EXTRAS="client control" to choose).
test-wheel: $(STAMP)
	UV=$(UV) infra/dev/check-wheel.sh $(BIN)/python $(EXTRAS)

$(JARS): infra/kafka/pom.xml $(STAMP)
	@$(PREREQS) java mvn
	$(BIN)/surplus kafka fetch
	touch $(JARS)

# Built once per version into .tools/ (git-ignored); .tools/toxiproxy-server points at it.
toxiproxy: $(TOXIPROXY)

$(TOXIPROXY): $(TOXIPROXY_BUILD)
	ln -sfn toxiproxy-$(TOXIPROXY_VERSION)/server $@

$(TOXIPROXY_BUILD):
	@$(PREREQS) go $(GO_TEST_MIN)
	GOBIN=$(abspath $(dir $@)) go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION)

# Built once per version into .tools/ like toxiproxy; .tools/ec2-metadata-mock points at it.
ec2-metadata-mock: $(AEMM)

$(AEMM): $(AEMM_BUILD)
	ln -sfn ec2-metadata-mock-$(AEMM_VERSION)/ec2-metadata-mock $@

$(AEMM_BUILD):
	@$(PREREQS) go $(GO_TEST_MIN)
	GOBIN=$(abspath $(dir $@)) go install github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock@$(AEMM_VERSION)

promtool:
	@infra/dev/system-package.sh $(PROMTOOL) prometheus "promtool: the metric lint and the alert rules' tests"
	@$(PROMTOOL) --version | head -1

# kcat produces the fault suite's forged notices, grants and targets straight to the topics, as a
# producer outside Surplus would (tests/faults/test_key_rotation.py); Debian's kcat package.
kcat:
	@infra/dev/system-package.sh kcat kcat "kcat: the fault suite's forged messages, from outside Surplus"
	@kcat -V 2>&1 | grep -m1 "^Version" | cut -d" " -f1,2

# prometheus.yml and the rules it loads are valid, and each alert's unit tests pass (< 1 s).
test-alerts: promtool
	$(PROMTOOL) check config infra/prometheus/prometheus.yml
	$(PROMTOOL) test rules infra/prometheus/tests/*.test.yml

$(HELM):
	@$(PREREQS) go $(GO_HELM_MIN)
	GOBIN=$(abspath $(dir $@)) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

$(KUBECONFORM):
	@$(PREREQS) go $(GO_HELM_MIN)
	GOBIN=$(abspath $(dir $@)) go install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)

$(CONTROLLER_GEN):
	@$(PREREQS) go $(GO_HELM_MIN)
	GOBIN=$(abspath $(dir $@)) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

$(K8S_SCHEMAS)/.built: $(CONTROLLER_GEN) $(STAMP) infra/helm/kubeconform_schemas.py infra/helm/crds/go.mod
	rm -rf $(K8S_SCHEMAS) && mkdir -p $(K8S_SCHEMAS)
	$(BIN)/pip download -q --no-deps kubernetes-validate==$(K8S_SCHEMAS_VERSION) -d $(K8S_SCHEMAS)
	cd infra/helm/crds && $(abspath $(CONTROLLER_GEN)) crd:crdVersions=v1,maxDescLen=0 \
	  paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 \
	  output:crd:dir=$(abspath $(K8S_SCHEMAS))/crd-yaml
	$(BIN)/python infra/helm/kubeconform_schemas.py --wheel $(K8S_SCHEMAS)/kubernetes_validate-*.whl \
	  --versions $(HELM_KUBE_VERSIONS) --crds $(K8S_SCHEMAS)/crd-yaml --out $(K8S_SCHEMAS)
	touch $@

# Grafana's dashboard and panel types (@grafana/schema) and the TypeScript compiler that checks
# the chart's dashboard against them (tests/helm/test_dashboard_schema.py), from npm at the
# versions infra/grafana/schema/package-lock.json pins. Node.js 18+.
GRAFANA_SCHEMA := infra/grafana/schema/node_modules/.package-lock.json
$(GRAFANA_SCHEMA): infra/grafana/schema/package-lock.json
	@command -v npm >/dev/null || { echo "helm-check: npm (Node.js 18+) checks the dashboard: install it"; exit 1; }
	cd infra/grafana/schema && npm ci --no-audit --no-fund --ignore-scripts --silent
	touch $@

# A Kubernetes API server to install the chart on (tests/helm/test_install.py): kube-apiserver
# and etcd at the versions k8s.io/kubernetes pins, from the Go module proxy. Its go.mod replaces
# its k8s.io/* modules with ./staging/src/..., which its module zip leaves out (they are modules
# of their own), so `go install` fails: built in a copy whose replaces name the published
# v0.x.y of each, etcd through etcdmain (a three-line main); the version the server reports (and
# helm checks Chart.yaml's kubeVersion against) set as the release's build sets it. ~8 min of Go
# builds on 2 cores once; then a link from the warm cache.
KUBE_VERSION   := v1.37.0
KUBE_STAGING   := v0.37.0
KUBE_APISERVER := .tools/kube-$(KUBE_VERSION)/kube-apiserver
KUBE_ETCD      := .tools/kube-$(KUBE_VERSION)/etcd

$(KUBE_APISERVER):
	@$(PREREQS) go $(GO_HELM_MIN)
	@set -e; src=$$(go mod download -json k8s.io/kubernetes@$(KUBE_VERSION) \
	  | $(PY) -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'); \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; cp -r "$$src"/. "$$tmp"; chmod -R u+w "$$tmp"; \
	cd "$$tmp" && rm -f go.work go.work.sum && \
	sed -i -E 's#^(\s*)(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+$$#\1\2 => \2 $(KUBE_STAGING)#' go.mod && \
	mkdir -p cmd/etcd && printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >cmd/etcd/main.go && \
	GOWORK=off GOFLAGS=-mod=mod go build -trimpath -o $(abspath $(dir $@))/ \
	  -ldflags "-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	    -X k8s.io/component-base/version.gitMajor=1 \
	    -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION)))" \
	  ./cmd/kube-apiserver ./cmd/etcd
	@$@ --version

helm-check: $(KUBE_APISERVER)
helm-check: export KUBE_APISERVER := $(abspath $(KUBE_APISERVER))
helm-check: export ETCD := $(abspath $(KUBE_ETCD))
helm-check: export KUBE_CRDS := $(abspath $(K8S_SCHEMAS))/crd-yaml

# The chart with its defaults and with every option on (ci/*-values.yaml): helm lint, then what
# helm template renders for each Kubernetes version through kubeconform -strict, then
# tests/helm (what Surplus makes of the rendered settings). Cold: ~5 min of Go builds, once.
helm-check: $(HELM) $(KUBECONFORM) $(K8S_SCHEMAS)/.built $(GRAFANA_SCHEMA)
	@mkdir -p out/helm
	@for values in "" $(CHART)/ci/*-values.yaml; do \
	  echo "helm lint --strict $(CHART) $${values:+--values $$values}"; \
	  $(HELM) lint --strict $(CHART) $${values:+--values $$values} 2>out/helm/lint.err \
	    || { cat out/helm/lint.err; exit 1; }; done
	@for version in $(HELM_KUBE_VERSIONS); do for values in "" $(CHART)/ci/*-values.yaml; do \
	  echo "helm template $(CHART) --kube-version $$version $${values:+--values $$values} | kubeconform -strict"; \
	  $(HELM) template surplus $(CHART) --kube-version $$version $${values:+--values $$values} \
	    >out/helm/rendered.yaml 2>out/helm/template.err || { cat out/helm/template.err; exit 1; }; \
	  $(KUBECONFORM) -strict -summary -kubernetes-version $$version \
	    -schema-location '$(K8S_SCHEMAS)/{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json' \
	    -schema-location '$(K8S_SCHEMAS)/crds/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json' \
	    out/helm/rendered.yaml || exit 1; done; done
	HELM=$(abspath $(HELM)) $(BIN)/pytest -q -m helm tests/helm

# The documentation site (mkdocs.yml) into site/; --strict: a broken link or anchor fails (~1 s).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# MLServer (PyPI) in a virtualenv of its own, from infra/mlserver/requirements.txt: the model
# server the OIP backend's integration test and `surplus bench oip` put a worker in front of.
# Its dependencies (FastAPI, gRPC, scikit-learn, pandas) never meet ours. MLServer 1.7.1 takes
# Python 3.9-3.12: the first 3.11 or 3.12 on the PATH or in pyenv (MLSERVER_PY= to choose).
MLSERVER_VENV  := .venv-mlserver
MLSERVER_STAMP := $(MLSERVER_VENV)/.installed
ifeq ($(origin MLSERVER_PY),undefined)
MLSERVER_PY := $(shell for p in python3.12 python3.11 python3 \
                 $$(ls -d "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.1[12].*/bin/python3.1[12] 2>/dev/null | sort -rV); do \
                 $$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))' \
                 >/dev/null 2>&1 && { echo $$p; break; }; done)
endif

mlserver: $(MLSERVER_STAMP)

$(MLSERVER_STAMP): infra/mlserver/requirements.txt
	@test -n "$(MLSERVER_PY)" || { echo "MLServer 1.7.1 needs Python 3.11 or 3.12 (none on the PATH or in pyenv): install one, or name it with MLSERVER_PY=/path/to/python3.x"; exit 1; }
	test -x $(MLSERVER_VENV)/bin/python || $(MLSERVER_PY) -m venv $(MLSERVER_VENV)
	$(MLSERVER_VENV)/bin/pip install -q --upgrade pip
	$(MLSERVER_VENV)/bin/pip install -q -r infra/mlserver/requirements.txt
	touch $@

# The simulator's scenario tests (virtual time and seeded draws: no timer, socket or broker
# decides their outcome) run beside the live suite, in a session of their own at the lowest CPU
# priority: they take the CPU the live tests leave idle while those wait on brokers, processes
# and timers, and yield it whenever a live test wants it (nice 19 weighs 15 against 1,024).
# Their report follows the live suite's. The fault suite runs after both, in a session of its
# own (a fresh broker, its figures printed last).
SIM_TESTS := tests/scenarios
test: setup $(TOXIPROXY) $(AEMM) promtool kcat docs mlserver
	$(BIN)/ruff check .
	$(BIN)/mypy
	@log=$$(mktemp) base=$$(mktemp -d); \
	nice -n 19 $(BIN)/pytest -q -p no:cacheprovider --basetemp=$$base -m "not gpu" \
	  $(SIM_TESTS) >$$log 2>&1 & sim=$$!; \
	trap 'kill $$sim 2>/dev/null; rm -rf $$log $$base' EXIT; \
	echo "$(SIM_TESTS): running beside the live suite (nice 19), reported after it"; \
	$(BIN)/pytest -q -m "not faults and not helm and not gpu" --ignore=$(SIM_TESTS); live=$$?; \
	wait $$sim; simulated=$$?; \
	echo "--- $(SIM_TESTS), run beside the live suite (exit $$simulated):"; cat $$log; \
	test $$live -eq 0 && test $$simulated -eq 0
	$(BIN)/pytest -q -m faults

test-faults: setup $(TOXIPROXY) kcat
	$(BIN)/pytest -q -m faults

# The worker's CUDA path (tests/gpu): on a machine with a GPU; fails where none is seen.
test-gpu: setup
	$(BIN)/pytest -q -m gpu tests/gpu

# No broker, no Kafka jars, no full-length goldens: the loop to run while editing (~1 min).
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not kafka and not slow and not faults and not helm and not gpu" --durations=5

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

demo: setup
	$(BIN)/surplus demo --out out/demo

# The demo's processes under steady load for SOAK_MINUTES; exits 1 naming what grew.
SOAK_MINUTES ?= 30
soak: setup
	$(BIN)/surplus soak --minutes $(SOAK_MINUTES) --out out/soak

bench: setup mlserver
	$(BIN)/surplus bench --out out/bench

# docker-compose.yml as `docker compose config` sees it (compose-spec's loader where no Docker).
compose-check:
	@if docker compose version >/dev/null 2>&1; then docker compose config -q; \
	else cd infra/compose-check && go run . ../../docker-compose.yml >/dev/null; fi
	@echo "docker-compose.yml: valid"

clean:
	rm -rf out site .pytest_cache .mypy_cache .ruff_cache

# Docker with no registry (docs/deployment.md): a local engine (Debian's dockerd, installed
# only with SURPLUS_INSTALL_SYSTEM_PACKAGES=1; overlay2 or vfs storage, no bridge: host
# networking only, data root in .docker/, started by these targets when none answers and
# stopped after), images made from a
# debootstrapped Debian base (`make images`), the Kafka tests through testcontainers
# (`make test-containers`) and the compose stack up, checked and down (`make compose-up-test`).
DOCKER_DIR      := .docker
ENGINE          := infra/docker/engine.sh
KAFKA_VERSION   := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' infra/kafka/pom.xml)
COMPOSE_VERSION := v2.40.3
COMPOSE         := .tools/compose-$(COMPOSE_VERSION)/docker-compose
# The Kafka integration tests the testcontainers path runs: the contract, the worker, the client
# and the control plane on a real broker (18 tests, ~2.5 min).
CONTAINER_TESTS := tests/integration/test_contract_on_kafka.py tests/integration/test_worker_on_kafka.py \
                   tests/integration/test_client_on_kafka.py tests/integration/test_control_plane.py
# Runs CMD with DOCKER_HOST set to an engine that answers, stopping the engine after if it was
# started for CMD.
with-engine = host=$$($(ENGINE) start $(DOCKER_DIR)) || exit 1; export DOCKER_HOST=$$host; rc=0; \
	$(1) || rc=$$?; $(ENGINE) stop $(DOCKER_DIR); exit $$rc

.PHONY: images test-containers compose-up-test

# Compose v2 (the `docker compose` plugin's binary, also run standalone), from the Go module
# proxy. Built in a copy of the module: its go.mod has exclude directives, which `go install`
# refuses.
$(COMPOSE):
	@$(PREREQS) go 1.24.9
	@set -e; src=$$(go mod download -json github.com/docker/compose/v2@$(COMPOSE_VERSION) \
	  | $(PY) -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'); \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; cp -r "$$src"/. "$$tmp"; chmod -R u+w "$$tmp"; \
	cd "$$tmp" && go build -trimpath -o $(abspath $@) \
	  -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$(COMPOSE_VERSION)" ./cmd
	@$@ version

# surplus-base:bookworm, surplus-kafka:$(KAFKA_VERSION), surplus:local, surplus-worker:local and
# surplus-prometheus:local (infra/docker/images.sh; docs/deployment.md has sizes, build times);
# IMAGES=cuda adds surplus-worker-cuda:local, the workers' image for GPU nodes.
IMAGES ?= all
images: setup
	@$(call with-engine,PIP=$(BIN)/pip infra/docker/images.sh $(KAFKA_VERSION) $(IMAGES))

# The Kafka integration tests once through testcontainers: the broker is the surplus-kafka image
# (the embedded broker's jars), on the host's network; Ryuk is off (the fixture removes the
# container). No fallback: without Docker these tests fail.
test-containers: setup
	@$(call with-engine,PIP=$(BIN)/pip infra/docker/images.sh $(KAFKA_VERSION) kafka && \
	  env -u KAFKA_BOOTSTRAP_SERVERS TESTCONTAINERS_RYUK_DISABLED=true SURPLUS_TEST_DOCKER=require \
	  SURPLUS_KAFKA_IMAGE=surplus-kafka:$(KAFKA_VERSION) $(BIN)/pytest -q $(CONTAINER_TESTS))

# docker-compose.yml with docker-compose.local.yml: up, infra/docker/compose/check.py, down.
compose-up-test: setup $(COMPOSE)
	@$(call with-engine,PIP=$(BIN)/pip infra/docker/images.sh $(KAFKA_VERSION) && \
	  infra/docker/compose-up-test.sh $(COMPOSE) $(BIN)/python $(KAFKA_VERSION))
