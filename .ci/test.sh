#!/usr/bin/env bash
# The README's test command (make test): starts Azurite, runs every test
# under -race against the in-memory, local and Azurite backends with real
# FUSE mounts, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

./.ci/azurite.sh install
./.ci/azurite.sh start
# On a failure, what the machine and Azurite looked like: a stalled
# emulator (CI saw one not answer for over 90 s) or a starved machine is
# then told apart from a defect.
on_exit() {
	local rc=$?
	if [ "$rc" -ne 0 ]; then
		echo "--- test.sh failed ($rc): load $(cut -d' ' -f1-3 /proc/loadavg)," \
			"$(awk '/MemAvailable/{print int($2/1024)}' /proc/meminfo) MiB available" >&2
		./.ci/azurite.sh status >&2 || true
	fi
	./.ci/azurite.sh stop
}
trap on_exit EXIT

export BLOBFS_TEST_AZURITE="${BLOBFS_TEST_AZURITE:-http://127.0.0.1:${AZURITE_PORT:-10000}/devstoreaccount1}"
go vet ./...
# Everything under the race detector; then the multi-GiB integrity run,
# which the race detector makes too slow, without it.
go test -race -timeout 25m -count=1 ./...
go test -timeout 10m -count=1 -run 'TestIntegrityLargeFiles/local' ./fusefs
