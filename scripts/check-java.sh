#!/usr/bin/env bash
# DynamoDB Local (the lease table in every local run and test) needs Java 17 or newer.
set -euo pipefail
if ! command -v java >/dev/null 2>&1; then
  echo "error: Java 17+ is required for DynamoDB Local and was not found; install it with: sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi
version=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
if [[ "$major" == "1" ]]; then major=$(echo "$version" | cut -d. -f2); fi
if (( major < 17 )); then
  echo "error: Java 17+ is required for DynamoDB Local, found $version; install it with: sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi
