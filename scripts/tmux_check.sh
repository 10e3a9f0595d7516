#!/usr/bin/env bash
# Use `sfchat host` the way a person does, in a real terminal (tmux): start it with local peers, wait for the
# ring, type a prompt, read the answer and the panels off the screen, time how fast a key press shows while the
# model generates, change a setting, quit with Ctrl+Q, and check that every process it started is gone.
#
#   scripts/tmux_check.sh [MODEL] [PEERS]      (default: smollm2-135m, 2 local peers)
#
# Runs in private data/config/cache dirs; prints the screens it saw; exits non-zero on the first failed check.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${1:-smollm2-135m}"
PEERS="${2:-2}"
PROMPT="${TMUX_CHECK_PROMPT:-What is the capital of France? Answer in one sentence.}"
EXPECT="${TMUX_CHECK_EXPECT:-Paris}"  # a word the answer must contain ("" to skip)
export SFCHAT_MODELS_DIR="${SFCHAT_MODELS_DIR:-$PWD/.cache/models}"
WORK="$(mktemp -d)"
export SFCHAT_DATA_DIR="$WORK/data" SFCHAT_CONFIG_DIR="$WORK/config" SFCHAT_CACHE_DIR="$WORK/cache"
SESSION="sfchat-check-$$"
PY="${PYTHON:-$PWD/.venv/bin/python}"

pane() { tmux capture-pane -p -t "$SESSION"; }
show() { echo "----- $1 -----"; pane | sed -e 's/[[:space:]]*$//' | grep -v '^$' || true; echo "-----"; }
fail() { echo "FAIL: $*" >&2; show "screen at failure" >&2; exit 1; }
cleanup() { tmux kill-session -t "$SESSION" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# wait_for REGEX SECONDS [GREP_FLAG]: until the screen shows it (-F: a fixed string, not a pattern)
wait_for() {
    local deadline=$((SECONDS + $2))
    until pane | grep -q "${3:--E}" -- "$1"; do
        [ $SECONDS -lt $deadline ] || fail "no '$1' on screen after $2 s"
        sleep 0.2
    done
}

# type_line TEXT: clear the prompt line, type TEXT and press Enter, each step once the screen shows the last.
# Keys sent at once race: Ctrl+U goes up to the app's bindings while printable keys already queued behind it are
# inserted first, and then wiped with the rest of the line.
type_line() {
    tmux send-keys -t "$SESSION" C-u
    wait_for "▊  Ask anything" 10  # the empty prompt shows its placeholder
    tmux send-keys -t "$SESSION" -l "$1"
    wait_for "▊  $1" 10 -F
    tmux send-keys -t "$SESSION" Enter
}

# settle SECONDS COMMAND...: until the command succeeds (false after SECONDS)
settle() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# echo_keys LABEL: type a few keys one at a time, each timed from send-keys until the prompt line shows it.
# Coarse: every poll runs capture-pane, so the numbers include tmux's own cost (scripts/key_echo.py times
# the echo precisely on a pseudo-terminal).
echo_keys() {
    local typed="" worst=0 total=0 n=0 start ms
    for ch in q z x j k; do
        [ "$1" = idle ] || pane | grep -qF "answering…" || break  # only while the answer streams
        typed="$typed$ch"
        start=$(now_ms)
        tmux send-keys -t "$SESSION" -l "$ch"
        until pane | grep -qF "▊  $typed"; do
            [ $(($(now_ms) - start)) -lt 5000 ] || fail "the key '$ch' did not show within 5 s"
            sleep 0.02  # a tight loop of capture-pane would take a core from the app it measures
        done
        ms=$(($(now_ms) - start))
        total=$((total + ms)) n=$((n + 1))
        [ $ms -gt $worst ] && worst=$ms
        sleep 0.1
    done
    [ $n -gt 0 ] && echo "key echo $1 (tmux polling): mean $((total / n)) ms, worst $worst ms over $n keys"
    return 0
}

tmux new-session -d -s "$SESSION" -x 150 -y 45 \
    -e SFCHAT_MODELS_DIR="$SFCHAT_MODELS_DIR" -e SFCHAT_DATA_DIR="$SFCHAT_DATA_DIR" \
    -e SFCHAT_CONFIG_DIR="$SFCHAT_CONFIG_DIR" -e SFCHAT_CACHE_DIR="$SFCHAT_CACHE_DIR" \
    "unset COLUMNS LINES; $PY -m sfchat host --model '$MODEL' --local-peers $PEERS --listen 127.0.0.1:0 --max-new-tokens 48 \
       --temperature 0; echo EXITED \$?; sleep 600"
t0=$SECONDS
wait_for "^  ready: " 180
echo "the ring was ready after $((SECONDS - t0)) s"
for name in $(echo abcdefghij | cut -c1-"$PEERS" | fold -w1); do  # local-a, local-b, …
    wait_for "local-$name .* ready" 60  # members joining late re-plan the ring
done
TOKEN="$(pane | grep -o -- '--token [A-Za-z0-9_-]*' | head -1 | cut -d' ' -f2)"
[ -n "$TOKEN" ] || fail "no invite with a token on screen"
show "ready"

echo_keys "idle"
type_line "$PROMPT"
wait_for "answering" 30
wait_for "tokens/round +[0-9]" 60  # the stats panel shows the rounds
echo_keys "while generating"
wait_for "^  ready( |$)" 120  # the status line under the prompt
show "answered"
if [ -n "$EXPECT" ]; then pane | grep -qF "$EXPECT" || fail "the answer does not mention '$EXPECT'"; fi
pane | grep -Eq "tokens/round +[0-9]" || fail "no tokens per round in the stats panel"

type_line "/temp 0.5"  # the keys typed while it generated are cleared first
settle 10 grep -q "temperature = 0.5" "$SFCHAT_CONFIG_DIR/settings.toml" 2>/dev/null \
    || fail "/temp did not reach the settings file"
ls "$SFCHAT_DATA_DIR"/chats/*.json >/dev/null 2>&1 || fail "the chat was not saved"

tmux send-keys -t "$SESSION" C-q
wait_for "EXITED 0" 30
show "after Ctrl+Q"
pane | grep -qF "sfchat host --resume" || fail "no resume hint after quitting"
settle 10 eval '! pgrep -f -- "--token $TOKEN" >/dev/null' || fail "processes of this ring are still running"
echo "OK: tmux check passed"
