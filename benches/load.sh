#!/usr/bin/env bash
# The proxy under load, on loopback only, in one run:
#
#   direct       wrk -> sim                        (the simulated provider alone)
#   passthrough  wrk -> benches/passthrough.rs -> sim   (a bare hyper + reqwest proxy)
#   switchyard   wrk -> switchyard serve (Noirdoc policy) -> sim
#
# ROUNDS rounds of the three, interleaved so that the machine's noise falls
# on all of them alike; medians are reported. First at saturation
# (CONNECTIONS connections: throughput, and latency that is mostly queueing),
# then unloaded (one connection, one request at a time: the latency each hop
# adds, with no queue in front of it). Then STREAMS clients each keep
# a streamed answer open (about a second each) through the proxy while its
# resident memory is sampled, for Switchyard and for the pass-through: once
# with the short request above, once with a 17 KB conversation (a proxy
# that keeps copies of the request pays for them here). Last, with the
# sim restarted to stream without pauses (benches/load/quick-streams.yaml),
# one connection asks for one stream after another: what each hop adds to
# a stream, its end included.
#
#   benches/load.sh                       # the defaults below
#   ROUNDS=5 DURATION=20 benches/load.sh
#
# Installs wrk (Debian's package) when it is missing. Everything listens on
# 127.0.0.1 and stops when the script ends. The simulated providers must be
# on 127.0.0.1:9100, where the shipped catalogs point.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-32}
STREAMS=${STREAMS:-1000}
SIM=127.0.0.1:9100
PASSTHROUGH=127.0.0.1:9201
SWITCHYARD=127.0.0.1:9200
KEY=sk-noirdoc-acme
MODEL=gpt-5
# Noirdoc's first choice for this key and model: the tenant's own OpenAI key
# (acme-openai); the direct run and the pass-through go to it too.
PROVIDER=acme-openai

if ! command -v wrk >/dev/null; then
    echo "installing wrk"
    sudo_if_needed=""
    [ "$(id -u)" -ne 0 ] && sudo_if_needed=sudo
    $sudo_if_needed apt-get install -y wrk >/dev/null ||
        { $sudo_if_needed apt-get update >/dev/null && $sudo_if_needed apt-get install -y wrk >/dev/null; }
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt $((STREAMS * 3)) ]; then
    echo "error: $STREAMS streams need $((STREAMS * 3)) file descriptors; this shell allows $(ulimit -n)" >&2
    exit 2
fi

echo "building (release)"
cargo build --release --quiet --bin switchyard --example passthrough
BIN=target/release/switchyard

work=$(mktemp -d)
pids=()
# The first sim's pid until the last part stops it.
sim_pid=""
cleanup() {
    for pid in $sim_pid "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

for addr in $SIM $PASSTHROUGH $SWITCHYARD; do
    if (exec 3<>"/dev/tcp/${addr%:*}/${addr#*:}") 2>/dev/null; then
        echo "error: $addr is in use; stop what listens there first" >&2
        exit 2
    fi
done

wait_for() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "error: nothing listens on $1; see $work/*.log" >&2
    exit 1
}

RUST_LOG=off "$BIN" sim --listen $SIM --scenario benches/load/scenario.yaml >"$work/sim.log" 2>&1 &
sim_pid=$!
target/release/examples/passthrough $PASSTHROUGH "http://$SIM/$PROVIDER" >"$work/passthrough.log" 2>&1 &
passthrough_pid=$!
pids+=($passthrough_pid)
# The catalog's credentials come from the environment; the sim takes any.
NOIRDOC_AKI_IO_KEY=load NOIRDOC_IONOS_KEY=load NOIRDOC_SCALEWAY_KEY=load \
    NOIRDOC_TOGETHER_KEY=load NOIRDOC_OPENAI_KEY=load NOIRDOC_ANTHROPIC_KEY=load \
    ACME_OPENAI_KEY=load \
    "$BIN" serve --policy policies/noirdoc.policy --listen $SWITCHYARD --no-watch \
    >"$work/serve.log" 2>&1 &
switchyard_pid=$!
pids+=($switchyard_pid)
wait_for $SIM
wait_for $PASSTHROUGH
wait_for $SWITCHYARD

request() { # stream(true|false) -> a wrk script posting the chat request
    cat >"$work/request-$1.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"model": "$MODEL", "stream": $1, "messages": [{"role": "user", "content": "Hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
EOF
    echo "$work/request-$1.lua"
}
plain=$(request false)
streamed=$(request true)
# A streamed request carrying a conversation of 36 turns, about 17 KB.
conversation="$work/request-conversation.lua"
cat >"$conversation" <<EOF
local turn = '{"role": "user", "content": "' .. string.rep("Lorem ipsum dolor sit amet. ", 16) .. '"}'
local turns = {}
for i = 1, 36 do turns[i] = turn end
wrk.method = "POST"
wrk.body = '{"model": "$MODEL", "stream": true, "messages": [' .. table.concat(turns, ", ") .. ']}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
EOF

url_of() {
    case $1 in
        direct) echo "http://$SIM/$PROVIDER/v1/chat/completions" ;;
        passthrough) echo "http://$PASSTHROUGH/v1/chat/completions" ;;
        switchyard) echo "http://$SWITCHYARD/v1/chat/completions" ;;
    esac
}

# The answer must come from the provider the direct run measures: one
# request through Switchyard, then the sim's record says who was asked.
curl -s -X DELETE "http://$SIM/_sim/requests" >/dev/null
curl -s -o /dev/null "$(url_of switchyard)" -H "Authorization: Bearer $KEY" \
    -H 'Content-Type: application/json' \
    -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}"
asked=$(curl -s "http://$SIM/_sim/requests" | grep -o '"provider": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/' | sort -u | tr '\n' ' ')
if [ "$asked" != "$PROVIDER " ]; then
    echo "error: Switchyard asked '${asked% }', not $PROVIDER; see $work/serve.log" >&2
    exit 1
fi

# wrk's figure in microseconds ("812.00us", "1.20ms", "1.01s").
to_us() {
    awk -v v="$1" 'BEGIN {
        n = v + 0
        if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000;
        else if (v ~ /s$/) print n * 1000000; else print n }'
}

# One wrk run: prints "rps p50_us p99_us", fails on any error response.
run() { # target duration connections script
    local out
    out=$(wrk -t1 -c"$3" -d"$2"s --latency --timeout 10s -s "$4" "$(url_of "$1")")
    if grep -qE "Non-2xx|Socket errors" <<<"$out"; then
        echo "error: $1 answered with errors:" >&2
        echo "$out" >&2
        exit 1
    fi
    local rps p50 p99
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    p50=$(to_us "$(awk '$1 == "50%" {print $2}' <<<"$out")")
    p99=$(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")
    echo "$rps $p50 $p99"
}

# ROUNDS interleaved rounds of the three targets, each line also kept in
# a file: "target rps p50_us p99_us".
rounds() { # connections script file unit
    for round in $(seq "$ROUNDS"); do
        for target in direct passthrough switchyard; do
            read -r rps p50 p99 <<<"$(run $target "$DURATION" "$1" "$2")"
            echo "$target $rps $p50 $p99" >>"$3"
            printf '  round %s %-12s %10s %s  p50 %8s us  p99 %8s us\n' \
                "$round" $target "$rps" "$4" "$p50" "$p99"
        done
    done
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "warming up"
for target in direct passthrough switchyard; do run $target 2 "$CONNECTIONS" "$plain" >/dev/null; done

echo "$ROUNDS rounds of ${DURATION}s per target, $CONNECTIONS connections, one wrk thread"
rounds "$CONNECTIONS" "$plain" "$work/results" req/s

echo "$ROUNDS rounds of ${DURATION}s per target, unloaded: one connection"
rounds 1 "$plain" "$work/unloaded" req/s

declare -A RPS P50 P99 LONE_P50 LONE_P99
for target in direct passthrough switchyard; do
    RPS[$target]=$(awk -v t=$target '$1 == t {print $2}' "$work/results" | median)
    P50[$target]=$(awk -v t=$target '$1 == t {print $3}' "$work/results" | median)
    P99[$target]=$(awk -v t=$target '$1 == t {print $4}' "$work/results" | median)
    LONE_P50[$target]=$(awk -v t=$target '$1 == t {print $3}' "$work/unloaded" | median)
    LONE_P99[$target]=$(awk -v t=$target '$1 == t {print $4}' "$work/unloaded" | median)
done

# Resident memory while STREAMS streams are open: sampled every 0.2 s.
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
streams() { # target pid script -> "idle_kib peak_kib rps"
    local idle peak=0 sample out
    idle=$(rss_kib "$2")
    wrk -t2 -c"$STREAMS" -d"$DURATION"s --timeout 10s -s "$3" "$(url_of "$1")" >"$work/streams-$1" &
    local wrk_pid=$!
    while kill -0 $wrk_pid 2>/dev/null; do
        sample=$(rss_kib "$2")
        [ "$sample" -gt "$peak" ] && peak=$sample
        sleep 0.2
    done
    wait $wrk_pid
    out=$(cat "$work/streams-$1")
    if grep -qE "Non-2xx|Socket errors" <<<"$out"; then
        echo "error: $1 streams failed:" >&2
        echo "$out" >&2
        exit 1
    fi
    echo "$idle $peak $(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
}
echo "$STREAMS concurrent streams for ${DURATION}s"
streams switchyard $switchyard_pid "$streamed" >"$work/rss-switchyard"
streams passthrough $passthrough_pid "$streamed" >"$work/rss-passthrough"
echo "$STREAMS concurrent streams of a 17 KB conversation for ${DURATION}s"
streams switchyard $switchyard_pid "$conversation" >"$work/rss-switchyard-long"
streams passthrough $passthrough_pid "$conversation" >"$work/rss-passthrough-long"

echo "$ROUNDS rounds of ${DURATION}s per target: streams one after another on one connection"
if ! kill "$sim_pid" 2>/dev/null; then
    echo "error: the simulated providers stopped during the run; see $work/sim.log" >&2
    exit 1
fi
wait "$sim_pid" 2>/dev/null || true
sim_pid=""
RUST_LOG=off "$BIN" sim --listen $SIM --scenario benches/load/quick-streams.yaml >"$work/sim-quick.log" 2>&1 &
pids+=($!)
wait_for $SIM
# The proxies' pooled connections to the sim that stopped close first.
sleep 1
for target in direct passthrough switchyard; do run $target 2 1 "$streamed" >/dev/null; done
rounds 1 "$streamed" "$work/quick" streams/s
declare -A QUICK_P50 QUICK_P99
for target in direct passthrough switchyard; do
    QUICK_P50[$target]=$(awk -v t=$target '$1 == t {print $3}' "$work/quick" | median)
    QUICK_P99[$target]=$(awk -v t=$target '$1 == t {print $4}' "$work/quick" | median)
done

read -r sy_idle sy_peak sy_rps <"$work/rss-switchyard"
read -r pt_idle pt_peak pt_rps <"$work/rss-passthrough"
read -r sy_long_idle sy_long_peak sy_long_rps <"$work/rss-switchyard-long"
read -r pt_long_idle pt_long_peak pt_long_rps <"$work/rss-passthrough-long"

mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
added() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", a - b }'; }
cat <<EOF

Load run: $ROUNDS rounds x ${DURATION}s per target, $CONNECTIONS connections, wrk -t1,
POST /v1/chat/completions (model $MODEL, key $KEY), medians of the rounds.

| target | req/s | p50 | p99 |
|---|---:|---:|---:|
| direct to the sim | ${RPS[direct]} | ${P50[direct]} µs | ${P99[direct]} µs |
| bare pass-through | ${RPS[passthrough]} | ${P50[passthrough]} µs | ${P99[passthrough]} µs |
| Switchyard (Noirdoc) | ${RPS[switchyard]} | ${P50[switchyard]} µs | ${P99[switchyard]} µs |

- Switchyard / pass-through req/s: $(ratio "${RPS[switchyard]}" "${RPS[passthrough]}") (target >= 0.85)
- p50 added over direct at saturation: Switchyard $(added "${P50[switchyard]}" "${P50[direct]}") µs, pass-through $(added "${P50[passthrough]}" "${P50[direct]}") µs

Unloaded: one connection, one request at a time, medians of the rounds:

| target | p50 | p99 |
|---|---:|---:|
| direct to the sim | ${LONE_P50[direct]} µs | ${LONE_P99[direct]} µs |
| bare pass-through | ${LONE_P50[passthrough]} µs | ${LONE_P99[passthrough]} µs |
| Switchyard (Noirdoc) | ${LONE_P50[switchyard]} µs | ${LONE_P99[switchyard]} µs |

- p50 added over direct, unloaded: Switchyard $(added "${LONE_P50[switchyard]}" "${LONE_P50[direct]}") µs (target <= 100 µs), pass-through $(added "${LONE_P50[passthrough]}" "${LONE_P50[direct]}") µs

$STREAMS concurrent streams (about 1 s each) for ${DURATION}s, wrk -t2:

| proxy | RSS idle | RSS peak | streams/s |
|---|---:|---:|---:|
| Switchyard (Noirdoc) | $(mib "$sy_idle") MiB | $(mib "$sy_peak") MiB | $sy_rps |
| bare pass-through | $(mib "$pt_idle") MiB | $(mib "$pt_peak") MiB | $pt_rps |

- Switchyard's peak RSS with $STREAMS streams: $(mib "$sy_peak") MiB (target <= 50 MB)

The same with a 17 KB conversation in each request (run after the above,
in the same processes):

| proxy | RSS before | RSS peak | streams/s |
|---|---:|---:|---:|
| Switchyard (Noirdoc) | $(mib "$sy_long_idle") MiB | $(mib "$sy_long_peak") MiB | $sy_long_rps |
| bare pass-through | $(mib "$pt_long_idle") MiB | $(mib "$pt_long_peak") MiB | $pt_long_rps |

Streams one after another on one connection (five chunks, no pauses),
medians of the rounds:

| target | p50 | p99 |
|---|---:|---:|
| direct to the sim | ${QUICK_P50[direct]} µs | ${QUICK_P99[direct]} µs |
| bare pass-through | ${QUICK_P50[passthrough]} µs | ${QUICK_P99[passthrough]} µs |
| Switchyard (Noirdoc) | ${QUICK_P50[switchyard]} µs | ${QUICK_P99[switchyard]} µs |

- p50 added over direct to a whole stream: Switchyard $(added "${QUICK_P50[switchyard]}" "${QUICK_P50[direct]}") µs, pass-through $(added "${QUICK_P50[passthrough]}" "${QUICK_P50[direct]}") µs
EOF
