#!/usr/bin/env bash
# `make deploy`: check what a real deploy needs, each with a one-line message, pre-create the
# service-linked roles a first ECS deploy needs, then cdk bootstrap + cdk deploy.
# Extra arguments go to `cdk deploy` (e.g. -c stage=prod -c alarmEmail=ops@example.com).
set -euo pipefail

fail() {
  echo "error: $*" >&2
  exit 1
}

command -v aws >/dev/null 2>&1 \
  || fail "the AWS CLI is needed for make deploy (it reads your account and creates service-linked roles); install AWS CLI v2"
command -v npx >/dev/null 2>&1 || fail "npx (Node.js) is needed for make deploy; install Node.js 22 or newer"

# cdk deploy builds the worker image as a Docker asset, with `docker` or the CLI in CDK_DOCKER.
docker_cli=${CDK_DOCKER:-docker}
command -v "$docker_cli" >/dev/null 2>&1 \
  || fail "'$docker_cli' was not found: cdk deploy builds the worker image with Docker; install Docker or set CDK_DOCKER to a compatible CLI (finch, podman)"
"$docker_cli" info >/dev/null 2>&1 \
  || fail "'$docker_cli info' failed: start the container engine (cdk deploy builds the worker image)"

region=${AWS_REGION:-${AWS_DEFAULT_REGION:-}}
if [[ -z "$region" ]]; then
  region=$(aws configure get region 2>/dev/null || true)
fi
[[ -n "$region" ]] || fail "no AWS region: set AWS_REGION (or run: aws configure set region <region>)"

account=$(aws sts get-caller-identity --query Account --output text 2>/dev/null) \
  || fail "no usable AWS credentials: 'aws sts get-caller-identity' failed (run aws configure or aws sso login)"
[[ "$account" =~ ^[0-9]{12}$ ]] || fail "aws sts get-caller-identity returned '$account', not an account id"

# A first ECS service or ECS scalable target in an account fails while its service-linked
# role is still being created on demand; creating them first is idempotent.
ensure_service_linked_role() {
  local service=$1 output
  if output=$(aws iam create-service-linked-role --aws-service-name "$service" 2>&1); then
    echo "created the service-linked role for $service"
  elif [[ "$output" == *"has been taken"* ]]; then
    echo "the service-linked role for $service exists"
  else
    fail "could not create the service-linked role for $service: $(printf '%s' "$output" | tr '\n' ' ')"
  fi
}
ensure_service_linked_role ecs.amazonaws.com
ensure_service_linked_role ecs.application-autoscaling.amazonaws.com

echo "deploying to account $account, region $region"
npx cdk bootstrap "aws://$account/$region"
npx cdk deploy -c "account=$account" -c "region=$region" --require-approval broadening "$@"
