#!/usr/bin/env bash
# make bench: the throughput table. Runs against a private Azurite (a full
# run writes about 10 GiB, which must not fill a shared in-memory Azurite),
# started here and stopped at the end. Extra arguments go to blobfs-bench
# (-quick, -figures seq,memory, -reps N, -out FILE ...). A full run (no
# arguments) then runs the random-read and write-back rows on a fresh
# Azurite. The report, both runs' rows in one, goes to $BENCH_REPORT_DIR
# (default bench-report/; a relative path is from the repository's root):
# report.json, report.tsv, report.md and report.svg (docs/benchmarks.md).
# A full run, or BENCH_DIRS=1, then times directories with blobfs-dirbench:
# the first and all entries of a 100,000-blob directory, find over 200
# directories of 1,000 files (on Azurite, and on the memory store with
# 20 ms a request), and the memory a listed directory takes per entry.
set -euo pipefail
cd "$(dirname "$0")/.."
export AZURITE_PORT=${BENCH_AZURITE_PORT:-10099}
./.ci/azurite.sh install
./.ci/azurite.sh start
trap './.ci/azurite.sh stop' EXIT
endpoint="http://127.0.0.1:$AZURITE_PORT/devstoreaccount1"
# Each Azurite figure on a fresh Azurite: an in-memory one frees deleted
# blobs in a garbage collection minutes later, which takes a CPU from
# whatever figure runs then.
fresh='./.ci/azurite.sh stop && ./.ci/azurite.sh start'
report_dir=${BENCH_REPORT_DIR:-bench-report}
go run ./bench/cmd/blobfs-bench -endpoint "$endpoint" -fresh-azurite "$fresh" -report-dir "$report_dir" "$@"
if [[ $# -eq 0 ]]; then
	# The random-read and write-back rows upload several GiB more than an
	# in-memory Azurite holds after a full run: a fresh one for them.
	# -merge adds their rows to the first run's report.
	./.ci/azurite.sh stop
	./.ci/azurite.sh start
	go run ./bench/cmd/blobfs-bench -endpoint "$endpoint" -fresh-azurite "$fresh" -figures random,write-back \
		-report-dir "$report_dir" -merge
fi
if [[ $# -eq 0 || ${BENCH_DIRS:-} == 1 ]]; then
	go build -o bin/blobfs-dirbench ./bench/cmd/blobfs-dirbench
	bin/blobfs-dirbench -endpoint "$endpoint" -bin blobfs=bin/blobfs -blobs 100000 -reps 3
	bin/blobfs-dirbench -endpoint "$endpoint" -bin blobfs=bin/blobfs -tree 200x1000 -reps 3
	bin/blobfs-dirbench -memory -blobs 100000 -latency 20ms -reps 3
	bin/blobfs-dirbench -memory -tree 200x1000 -latency 20ms -reps 3
	bin/blobfs-dirbench -per-entry 1000000
fi
