# blobfs — build, test, benchmark.
GO      ?= go
# The release is the image tag deploy/kustomization.yaml names; a build's
# version is the release and the commit (blobfs --version, the image's
# second tag).
RELEASE := $(shell sed -n 's/^ *newTag: *//p' deploy/kustomization.yaml)
VERSION ?= $(RELEASE)-$(shell git describe --always --dirty 2>/dev/null || echo dev)
BIN     := bin/blobfs
DEMO_MNT ?= /tmp/blobfs

.PHONY: build install demo test test-short test-csi check e2e image docker-image bench bench-restart lint clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/blobfs
	ln -sf blobfs bin/mount.blobfs

# Install blobfs and its mount(8) helper: mount -t blobfs and /etc/fstab run
# /sbin/mount.blobfs (mount(8) looks in /sbin), and
# deploy/systemd/blobfs@.service runs /sbin/blobfs; cmd/blobfs/docs_test.go
# checks that the unit and SBINDIR agree.
SBINDIR ?= /sbin
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(SBINDIR)/blobfs
	ln -sf blobfs $(DESTDIR)$(SBINDIR)/mount.blobfs

# Mount the embedded default store (a local directory) at $(DEMO_MNT).
demo: build
	mkdir -p $(DEMO_MNT)
	./$(BIN) mount $(DEMO_MNT)

# The whole suite: unit tests, real FUSE mounts against the in-memory,
# local and (with BLOBFS_TEST_AZURITE set) Azurite backends, under -race.
# .ci/azurite.sh starts Azurite; .ci/test.sh wraps both.
test:
	./.ci/test.sh

# The CSI driver's tests alone (csi-sanity, the kubelet sequence, bad
# input, manifests), against an Azurite already running.
test-csi:
	BLOBFS_TEST_AZURITE=$${BLOBFS_TEST_AZURITE:-http://127.0.0.1:10000/devstoreaccount1} \
		$(GO) test -race -count=1 ./csi/... ./deploy/... ./cmd/...

# End-to-end tests on a real kubelet (deploy/e2e): a single-node Kubernetes
# built on this machine, blobfs installed from this image with
# `kubectl apply -k` of deploy/ (through deploy/e2e/overlay), Azurite as the
# store; torn down afterwards. Root only; one run per machine. One
# scenario: make e2e E2E_ARGS='-run TestDynamicProvisioning'.
E2E_ARGS ?=
e2e: image
	BLOBFS_E2E=1 BLOBFS_E2E_IMAGE=$(CURDIR)/$(IMAGE_TAR) $(GO) test -count=1 -timeout 90m -v ./deploy/e2e $(E2E_ARGS)

# The container image of the CSI driver (controller and node plugin), built
# without a daemon (cmd/blobfs-image): bin/blobfs-image.tar, tagged
# blobfs:$(RELEASE) (what deploy/ runs) and blobfs:$(VERSION). Load it with
# `ctr -n k8s.io images import` or `docker load -i`. Reproducible: the same
# commit gives the same digest.
IMAGE_TAR ?= bin/blobfs-image.tar
image:
	mkdir -p bin/image
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "-s -w -buildid= -X main.version=$(VERSION)" -o bin/image/blobfs ./cmd/blobfs
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) $(GO) run ./cmd/blobfs-image \
		-binary bin/image/blobfs -version $(VERSION) -tag blobfs:$(RELEASE) -tag blobfs:$(VERSION) -o $(IMAGE_TAR)

# The same image with Docker (deploy/Dockerfile).
docker-image:
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) -t blobfs:$(RELEASE) -t blobfs:$(VERSION) .

test-short:
	$(GO) test -short ./...

# The model-based checker's soak (fusefs/modelcheck_test.go,
# docs/testing.md): many more and longer generated sequences than the
# fixed budget make test runs. CHECK_ARGS adds flags, e.g.
# CHECK_ARGS=-rapid.seed=N to replay a failure.
# TestModelCrash (mount A served by a child process that the checker
# kills) is slower, about 5 s a sequence: CHECK_CRASH_CHECKS of its own.
CHECK_CHECKS ?= 2000
CHECK_STEPS  ?= 200
CHECK_CRASH_CHECKS ?= 300
CHECK_ARGS   ?=
# TestFsx (fusefs/fsx_test.go: one file's data, mmap included) with
# FSX_OPS operations per backend; FSX_SEED=N replays one run.
FSX_OPS ?= 100000
FSX_SEED ?= 0
check:
	$(GO) test ./fusefs -run 'TestModel$$' -count=1 -timeout 60m -rapid.nofailfile \
		-rapid.checks=$(CHECK_CHECKS) -rapid.steps=$(CHECK_STEPS) $(CHECK_ARGS)
	$(GO) test ./fusefs -run 'TestModelCrash$$' -count=1 -timeout 120m -rapid.nofailfile \
		-rapid.checks=$(CHECK_CRASH_CHECKS) -rapid.steps=$(CHECK_STEPS) $(CHECK_ARGS)
	$(GO) test ./fusefs -run 'TestFsx$$' -count=1 -timeout 120m -v -args -fsx.ops=$(FSX_OPS) -fsx.seed=$(FSX_SEED)

bench: build
	./.ci/bench.sh $(BENCH_ARGS)

# Driver restarts: start-to-serving with the keeper against a fresh driver
# staging every volume, and the reader's pause (bench/restart.go).
bench-restart: build
	./.ci/bench-restart.sh $(BENCH_ARGS)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

clean:
	rm -rf bin
