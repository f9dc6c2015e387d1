# Shared set-up of the live scripts (source it): children tracked and stopped on exit, the
# simulated fleet started on ephemeral ports, the gateway started on free ports.
#
#   live_init NAME      TMP (a temporary directory, removed on exit), PIDS, and the traps:
#                       on a failure the last lines of every $TMP/*.log are printed
#   listening PORT      whether something accepts connections on 127.0.0.1:PORT
#   stop_all            stop every child in PIDS
#   start_fleet LOG N ARGS...   `$BIN sim-fleet ARGS...` logging to LOG; waits until it has
#                       printed its N backends (`name<TAB>url<TAB>profile`), which go to
#                       LOG.tsv; FLEET_BACKENDS is then their `pools.*.backends` YAML lines
#   start_gateway WRITE  up to five tries: picks GW_PORT and GW_ADMIN (GW_ADMIN = GW_PORT + 1),
#                       calls `WRITE GW_PORT GW_ADMIN` to write $TMP/pronto.yaml, starts
#                       `$BIN serve` on it (log $TMP/gateway.log) and waits for both listeners
#   admin_get ADMIN PATH   the admin listener's response to GET PATH (head and body)

live_init() {
    LIVE_NAME=$1
    TMP=$(mktemp -d -t "pronto-$1.XXXXXX")
    PIDS=()
    trap live_cleanup EXIT
    trap 'exit 130' INT TERM
}

live_die() {
    echo "$LIVE_NAME: $*" >&2
    exit 1
}

stop_all() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}

live_cleanup() {
    local rc=$?
    stop_all
    if [[ $rc -ne 0 ]]; then
        for log in "$TMP"/*.log; do
            [[ -s "$log" ]] && { echo "--- $log (last 20 lines)" >&2; tail -n 20 "$log" >&2; }
        done
    fi
    rm -rf "$TMP"
    exit "$rc"
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_fleet() {
    local log=$1 n=$2 pid
    shift 2
    # Logs go to stdout too, so only the tab-separated lines are read.
    RUST_LOG=warn "$BIN" sim-fleet "$@" </dev/null >"$log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 300); do
        grep -E $'^[^\t]+\thttp://[^\t]+\t' "$log" >"$log.tsv" 2>/dev/null || true
        [[ $(wc -l <"$log.tsv") -ge $n ]] && break
        kill -0 "$pid" 2>/dev/null || live_die "sim-fleet exited"
        sleep 0.1
    done
    [[ $(wc -l <"$log.tsv") -ge $n ]] || live_die "sim-fleet did not start"
    FLEET_BACKENDS=""
    local name url
    while IFS=$'\t' read -r name url _; do
        FLEET_BACKENDS+="      - { name: $name, url: \"$url\" }"$'\n'
    done <"$log.tsv"
}

start_gateway() {
    local write=$1 attempt gw started=""
    for attempt in 1 2 3 4 5; do
        GW_PORT=$((20000 + RANDOM % 20000)) GW_ADMIN=$((GW_PORT + 1))
        if listening "$GW_PORT" || listening "$GW_ADMIN"; then continue; fi
        "$write" "$GW_PORT" "$GW_ADMIN" >"$TMP/pronto.yaml"
        RUST_LOG=${RUST_LOG:-warn} "$BIN" serve --config "$TMP/pronto.yaml" </dev/null \
            >"$TMP/gateway.log" 2>&1 &
        gw=$!
        for _ in $(seq 300); do
            kill -0 "$gw" 2>/dev/null || break
            if listening "$GW_PORT" && listening "$GW_ADMIN"; then started=1; break; fi
            sleep 0.1
        done
        if [[ -n $started ]]; then PIDS+=("$gw"); return; fi
        kill "$gw" 2>/dev/null || true
        wait "$gw" 2>/dev/null || true
        echo "$LIVE_NAME: gateway attempt $attempt failed to start" >&2
    done
    live_die "gateway did not start"
}

admin_get() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1"
     printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
     cat <&3)
}
