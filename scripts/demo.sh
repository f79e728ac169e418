#!/usr/bin/env bash
# The main job on a fresh machine: pull the default model, serve it, answer a prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
BLAZAR=.venv/bin/blazar
MODEL="${BLAZAR_DEMO_MODEL:-smollm2-135m}"
PROMPT="${BLAZAR_DEMO_PROMPT:-Why is the sky blue? Answer in two sentences.}"

$BLAZAR pull "$MODEL"
already_running=0
if $BLAZAR ps --json | grep -q '"url"'; then already_running=1; fi
echo ">>> $PROMPT"
$BLAZAR run "$MODEL" "$PROMPT" --temperature 0 --seed 42
echo
echo "And over HTTP, the way any OpenAI client asks:"
URL=$($BLAZAR ps --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["daemon"]["url"])')
curl -sS "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello in five words.\"}],\"max_tokens\":32}"
echo
if [ "$already_running" = 0 ]; then $BLAZAR stop; fi
