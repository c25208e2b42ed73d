#!/usr/bin/env bash
# Makes sure the services the storage tests need are running:
#   PostgreSQL on 127.0.0.1:5432, trust auth for local TCP, database "test"
#   Redis on 127.0.0.1:6379, no persistence
# Installs them (apt-get) if missing, starts them if stopped, and waits until
# both answer (bounded). Idempotent, and quick when both already run.
# Exit status: 0 when both answer, non-zero (with a loud message) otherwise.
set -euo pipefail

WAIT_SECONDS=${WAIT_SECONDS:-30}
PG_HOST=127.0.0.1
PG_PORT=5432
REDIS_PORT=${REDIS_PORT:-6379}

log() { echo "test-services: $*" >&2; }
die() {
	echo "" >&2
	echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
	echo "test-services: FAILED: $*" >&2
	echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
	exit 1
}

as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=
apt_install() {
	if [ -z "$apt_updated" ]; then
		log "apt-get update"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
		apt_updated=1
	fi
	log "apt-get install $*"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# wait_for NAME COMMAND...: polls COMMAND until it succeeds or WAIT_SECONDS pass.
wait_for() {
	local name=$1
	shift
	local deadline=$((SECONDS + WAIT_SECONDS))
	until "$@" >/dev/null 2>&1; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			return 1
		fi
		sleep 0.5
	done
	log "$name is up"
}

pg_up() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; }
psql_admin() { as_root su postgres -c "psql -v ON_ERROR_STOP=1 -qtAX $*"; }

ensure_postgres() {
	if command -v pg_isready >/dev/null 2>&1 && pg_up; then
		ensure_test_database
		return
	fi
	if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
		apt_install postgresql
	fi
	local version
	version=$(ls /etc/postgresql | sort -V | tail -n 1)
	[ -n "$version" ] || die "PostgreSQL installed but no cluster under /etc/postgresql"
	local conf=/etc/postgresql/$version/main
	# Trust auth for local TCP (test machines only), idempotently: the rules
	# go first so that they win over the packaged md5/scram ones.
	if ! grep -q '^# fencegw test-services' "$conf/pg_hba.conf"; then
		log "trust auth for 127.0.0.1 and ::1 in $conf/pg_hba.conf"
		as_root sh -c "{ printf '# fencegw test-services\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust\n'; cat '$conf/pg_hba.conf'; } > '$conf/pg_hba.conf.new' && mv '$conf/pg_hba.conf.new' '$conf/pg_hba.conf'"
	fi
	log "starting PostgreSQL $version"
	as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start ||
		as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload || true
	wait_for PostgreSQL pg_up || die "PostgreSQL did not answer on $PG_HOST:$PG_PORT within ${WAIT_SECONDS}s (see /var/log/postgresql/)"
	ensure_test_database
}

ensure_test_database() {
	if psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d test -qtAXc 'SELECT 1' >/dev/null 2>&1; then
		return
	fi
	log "creating database test (and role root)"
	psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -qtAXc 'CREATE DATABASE test' >/dev/null 2>&1 ||
		psql_admin "-c 'CREATE DATABASE test'" >/dev/null 2>&1 || true
	psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -qtAXc \
		"DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'root') THEN CREATE ROLE root SUPERUSER LOGIN; END IF; END\$\$" >/dev/null 2>&1 || true
	psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d test -qtAXc 'SELECT 1' >/dev/null 2>&1 ||
		die "PostgreSQL answers but 'psql -h $PG_HOST -U postgres -d test' fails (auth? see pg_hba.conf)"
}

redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping | grep -q PONG; }

ensure_redis() {
	if command -v redis-cli >/dev/null 2>&1 && redis_up; then
		return
	fi
	if ! command -v redis-server >/dev/null 2>&1; then
		apt_install redis-server
	fi
	log "starting Redis"
	redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no >/dev/null
	wait_for Redis redis_up || die "Redis did not answer on 127.0.0.1:$REDIS_PORT within ${WAIT_SECONDS}s"
}

ensure_postgres
ensure_redis
log "PostgreSQL on $PG_HOST:$PG_PORT (database test) and Redis on 127.0.0.1:$REDIS_PORT are ready"
