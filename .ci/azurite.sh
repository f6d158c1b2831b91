#!/usr/bin/env bash
# Azurite, the Azure Storage emulator, for blobfs's tests and CI.
#
#   .ci/azurite.sh install   npm-install the pinned azurite into the cache
#   .ci/azurite.sh start     start azurite-blob on 127.0.0.1:$AZURITE_PORT in
#                            the background; returns once the port answers
#   .ci/azurite.sh stop      stop the instance started by `start`
#   .ci/azurite.sh status    say whether it runs
#   .ci/azurite.sh env       print the variable that enables the Azurite tests
#
# Then: BLOBFS_TEST_AZURITE=http://127.0.0.1:10000/devstoreaccount1 go test ./blobstore/...
#
# Facts this relies on:
#   - The azblob SDK (v1.8) sends an x-ms-version newer than Azurite knows;
#     Azurite refuses it unless started with --skipApiVersionCheck.
#   - --loose accepts headers and query parameters Azurite does not support
#     instead of failing the request.
#   - --inMemoryPersistence keeps nothing on disk; a restart starts empty.
#   - The account is devstoreaccount1 with the well-known key that Azurite
#     ships in dist/src/common/utils/constants.js (EMULATOR_ACCOUNT_KEY),
#     also blobstore.AzuriteAccountKey.
#   - Azurite has no dfs (Data Lake) endpoint; only the blob service runs here.
#   - Azurite's blob GC, a mark-and-sweep every 10 minutes, blocks its event
#     loop while it runs: on the in-memory store a test run fills, for
#     minutes (a full `make test` here: no answer from 22:02:27 to 22:06:07,
#     and a test's container could not be created in 3 minutes). There is no
#     option for it; gc-once-a-day.js, preloaded, sets its interval
#     (utils/constants.js DEFAULT_GC_INTERVAL_MS) to a day. Deleted
#     containers' data then stays in memory until Azurite stops: at most
#     1.4 GiB resident in a whole `make test` here (1,372 MiB measured).
#
# Environment:
#   BLOBFS_CACHE       cache root (default $HOME/.cache/blobfs); azurite is
#                      installed in $BLOBFS_CACHE/azurite-$AZURITE_VERSION
#   AZURITE_PORT       blob port (default 10000)
#   AZURITE_HOST       address to listen on (default 127.0.0.1; the
#                      end-to-end tests' pods need it on their bridge)
#   AZURITE_RUN_DIR    pid and log files (default $BLOBFS_CACHE/azurite-run)
set -euo pipefail

AZURITE_VERSION=3.37.0
CACHE=${BLOBFS_CACHE:-${HOME:-/root}/.cache/blobfs}
PREFIX=$CACHE/azurite-$AZURITE_VERSION
PORT=${AZURITE_PORT:-10000}
HOST=${AZURITE_HOST:-127.0.0.1}
RUN_DIR=${AZURITE_RUN_DIR:-$CACHE/azurite-run}
PID_FILE=$RUN_DIR/azurite-$PORT.pid
LOG_FILE=$RUN_DIR/azurite-$PORT.log
BIN=$PREFIX/node_modules/.bin/azurite-blob

die() { echo "azurite.sh: $*" >&2; exit 1; }

installed() {
	[[ -x $BIN ]] && [[ $(node -p "require('$PREFIX/node_modules/azurite/package.json').version" 2>/dev/null) == "$AZURITE_VERSION" ]]
}

cmd_install() {
	command -v node >/dev/null || die "node is not installed (Debian: apt-get install -y nodejs npm)"
	command -v npm >/dev/null || die "npm is not installed (Debian: apt-get install -y npm)"
	if installed; then
		echo "azurite $AZURITE_VERSION already installed in $PREFIX"
		return
	fi
	mkdir -p "$PREFIX"
	# A private prefix with its own package.json keeps the install out of
	# the repository and independent of any global npm state.
	[[ -f $PREFIX/package.json ]] || echo '{"private": true}' >"$PREFIX/package.json"
	npm install --prefix "$PREFIX" --no-audit --no-fund --no-save --loglevel=error "azurite@$AZURITE_VERSION"
	installed || die "npm install finished but $BIN is missing"
	echo "azurite $AZURITE_VERSION installed in $PREFIX"
}

running_pid() {
	[[ -f $PID_FILE ]] || return 1
	local pid
	pid=$(<"$PID_FILE")
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

port_answers() {
	# bash's /dev/tcp: no curl or nc needed.
	(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

cmd_start() {
	installed || die "azurite $AZURITE_VERSION is not installed: run $0 install"
	if pid=$(running_pid); then
		echo "azurite already running (pid $pid) on 127.0.0.1:$PORT"
		return
	fi
	if port_answers; then
		die "127.0.0.1:$PORT is already in use by another process"
	fi
	mkdir -p "$RUN_DIR"
	# In-memory persistence refuses --location; run it in a fresh
	# temporary directory so that nothing it might write lands in the
	# caller's working tree.
	local work
	work=$(mktemp -d "${TMPDIR:-/tmp}/azurite.XXXXXX")
	local preload=$work/gc-once-a-day.js
	cat >"$preload" <<EOF
// Written by .ci/azurite.sh: Azurite's blob GC once a day, not every 10 minutes.
require("$PREFIX/node_modules/azurite/dist/src/blob/utils/constants").DEFAULT_GC_INTERVAL_MS = 24 * 60 * 60 * 1000;
EOF
	(cd "$work" && exec setsid node --require "$preload" "$PREFIX/node_modules/azurite/dist/src/blob/main.js" \
		--blobHost "$HOST" --blobPort "$PORT" \
		--inMemoryPersistence \
		--skipApiVersionCheck --loose \
		--disableTelemetry \
		--disableProductStyleUrl \
		--silent \
		</dev/null >"$LOG_FILE" 2>&1) &
	local pid=$!
	echo "$pid" >"$PID_FILE"
	echo "$work" >"$PID_FILE.location"
	for _ in $(seq 1 150); do
		if port_answers; then
			echo "azurite $AZURITE_VERSION started (pid $pid) on 127.0.0.1:$PORT, log $LOG_FILE"
			return
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			cat "$LOG_FILE" >&2 || true
			rm -rf -- "$work"
			rm -f "$PID_FILE" "$PID_FILE.location"
			die "azurite exited during start-up (log above)"
		fi
		sleep 0.1
	done
	cat "$LOG_FILE" >&2 || true
	cmd_stop >/dev/null
	die "azurite did not answer on 127.0.0.1:$PORT within 15s"
}

cmd_stop() {
	local pid
	if ! pid=$(running_pid); then
		echo "azurite is not running"
		rm -f "$PID_FILE"
		return
	fi
	kill "$pid"
	for _ in $(seq 1 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -9 "$pid" 2>/dev/null || true
	fi
	if [[ -f $PID_FILE.location ]]; then
		rm -rf -- "$(<"$PID_FILE.location")"
		rm -f "$PID_FILE.location"
	fi
	rm -f "$PID_FILE"
	echo "azurite stopped (pid $pid)"
}

cmd_status() {
	local pid
	if pid=$(running_pid); then
		echo "azurite running (pid $pid) on 127.0.0.1:$PORT," \
			"$(awk '/VmRSS/{print int($2/1024)}' "/proc/$pid/status") MiB resident," \
			"$(ps -o time= -p "$pid" | tr -d ' ') of CPU"
	else
		echo "azurite is not running"
		return 1
	fi
}

case ${1:-} in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
env) echo "BLOBFS_TEST_AZURITE=http://127.0.0.1:$PORT/devstoreaccount1" ;;
*) die "usage: $0 install|start|stop|status|env" ;;
esac
