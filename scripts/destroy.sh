#!/usr/bin/env bash
# `make destroy`: delete a dev stack (Leaseworker-dev) from the account and region of your
# credentials. Everything a dev stack creates has RemovalPolicy DESTROY, so nothing is left but
# what CDK bootstrap owns (the CDKToolkit stack and its asset bucket/repository, shared by
# every CDK app in the account) and the Container Insights log group ECS creates itself.
# A prod stack is refused unless ALLOW_PROD_DESTROY=Leaseworker-prod: it has termination
# protection, and its table, queues, stream, logs and key are retained (docs/infrastructure.md).
# Extra arguments go to `cdk destroy` (e.g. -c stage=prod).
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")

stage=dev
previous=""
for argument in "$@"; do
  case "$argument" in
    stage=*) [[ "$previous" == "-c" || "$previous" == "--context" ]] && stage=${argument#stage=} ;;
    --context=stage=*) stage=${argument#--context=stage=} ;;
  esac
  previous=$argument
done
stack="Leaseworker-$stage"
if [[ "$stage" == "prod" && "${ALLOW_PROD_DESTROY:-}" != "$stack" ]]; then
  echo "error: refusing to destroy $stack: prod keeps its data (retained table, queues, stream, logs, key) and has termination protection; if you mean it, set ALLOW_PROD_DESTROY=$stack and turn termination protection off first (aws cloudformation update-termination-protection --no-enable-termination-protection --stack-name $stack)" >&2
  exit 1
fi

# shellcheck source=scripts/aws-target.sh
source "$here/aws-target.sh"

# cdk destroy asks for confirmation on a terminal; without one (CI) the make target is the ask.
force=()
[[ -t 0 ]] || force=(--force)
echo "destroying $stack in account $account, region $region"
npx cdk destroy ${force[@]+"${force[@]}"} -c "account=$account" -c "region=$region" "$@"
