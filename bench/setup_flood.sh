#!/usr/bin/env bash
# Setup for bench/bench_flood.py on a fresh machine (root, Debian/Ubuntu): the two load
# generators from the distribution, netsniff-ng's trafgen (UDP junk) and wrk (the HTTP flood
# against llama-server), and the peer, llama.cpp's own llama-server (bench/setup_llamacpp.sh,
# ~10 minutes on 2 cores the first time). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v trafgen >/dev/null || need+=(netsniff-ng)
command -v wrk >/dev/null || need+=(wrk)
if ((${#need[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
ZEROLAYER_LLAMACPP_TARGETS=${ZEROLAYER_LLAMACPP_TARGETS:-llama-server} bash bench/setup_llamacpp.sh
