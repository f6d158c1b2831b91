#!/usr/bin/env bash
# make bench-restart: the restart benchmark (bench/restart.go): time from a
# CSI node driver's start to serving 1, 10 and 100 adopted mounts against a
# fresh driver staging them, and the pause a streaming reader sees across a
# SIGKILL + restart and a graceful handoff. Runs against a private Azurite,
# started here and stopped at the end. Needs root, /dev/fuse and bin/blobfs
# (make build). Extra arguments go to blobfs-restart-bench (-quick,
# -mounts 1,10, -reps N, -out FILE ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export AZURITE_PORT=${BENCH_AZURITE_PORT:-10098}
./.ci/azurite.sh install
./.ci/azurite.sh start
trap './.ci/azurite.sh stop' EXIT
go run ./bench/cmd/blobfs-restart-bench -endpoint "http://127.0.0.1:$AZURITE_PORT/devstoreaccount1" "$@"
