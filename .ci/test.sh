#!/usr/bin/env bash
# The README's test command (make test): starts Azurite, runs every test
# under -race against the in-memory, local and Azurite backends with real
# FUSE mounts, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

./.ci/azurite.sh install
./.ci/azurite.sh start
trap './.ci/azurite.sh stop' EXIT

export BLOBFS_TEST_AZURITE="${BLOBFS_TEST_AZURITE:-http://127.0.0.1:10000/devstoreaccount1}"
go vet ./...
go test -race -timeout 25m -count=1 ./... 2>&1 | tee /tmp/blobfs-test.log
