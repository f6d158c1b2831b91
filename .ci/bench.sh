#!/usr/bin/env bash
# make bench: the throughput table. Runs against a private Azurite (a full
# run writes about 10 GiB, which must not fill a shared in-memory Azurite),
# started here and stopped at the end. Extra arguments go to blobfs-bench
# (-quick, -figures seq,memory, -reps N, -out FILE ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export AZURITE_PORT=${BENCH_AZURITE_PORT:-10099}
./.ci/azurite.sh install
./.ci/azurite.sh start
trap './.ci/azurite.sh stop' EXIT
go run ./bench/cmd/blobfs-bench -endpoint "http://127.0.0.1:$AZURITE_PORT/devstoreaccount1" "$@"
