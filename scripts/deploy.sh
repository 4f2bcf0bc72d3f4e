#!/usr/bin/env bash
# `make deploy`: check what a real deploy needs, each with a one-line message, make sure the
# service-linked roles a first ECS deploy needs exist, then cdk bootstrap + cdk deploy for the
# account and region of your credentials (never cdk.json's placeholder account).
# Extra arguments go to `cdk deploy` (e.g. -c stage=prod -c alarmEmail=ops@example.com).
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")

# cdk deploy builds the worker image as a Docker asset, with `docker` or the CLI in CDK_DOCKER.
docker_cli=${CDK_DOCKER:-docker}
command -v "$docker_cli" >/dev/null 2>&1 || {
  echo "error: '$docker_cli' was not found: cdk deploy builds the worker image with Docker; install Docker or set CDK_DOCKER to a compatible CLI (finch, podman)" >&2
  exit 1
}
"$docker_cli" info >/dev/null 2>&1 || {
  echo "error: '$docker_cli info' failed: start the container engine (cdk deploy builds the worker image)" >&2
  exit 1
}

# shellcheck source=scripts/aws-target.sh
source "$here/aws-target.sh"

# cdk deploy asks before IAM or security-group changes, which needs a terminal. Without one
# (CI), say so now instead of failing halfway: the caller chooses the policy explicitly.
approval=(--require-approval broadening)
for argument in "$@"; do
  if [[ "$argument" == --require-approval* ]]; then approval=(); fi
done
if [[ ${#approval[@]} -gt 0 && ! -t 0 ]]; then
  fail "no terminal to approve IAM and security changes: in CI pass DEPLOY_ARGS=\"--require-approval never\" (after reviewing cdk diff), or run make deploy in a terminal"
fi

# A first ECS service or ECS scalable target in an account fails while its service-linked role
# is still being created on demand. An existing role is looked up first: creating it needs
# iam:CreateServiceLinkedRole, which a deployer whose roles already exist may well not have.
ensure_service_linked_role() {
  local service=$1 role=$2 output
  if aws iam get-role --role-name "$role" >/dev/null 2>&1; then
    echo "the service-linked role for $service exists"
  elif output=$(aws iam create-service-linked-role --aws-service-name "$service" 2>&1); then
    echo "created the service-linked role for $service"
  elif [[ "$output" == *"has been taken"* ]]; then
    echo "the service-linked role for $service exists"
  else
    fail "could not create the service-linked role for $service ($role): $(printf '%s' "$output" | tr '\n' ' ')"
  fi
}
ensure_service_linked_role ecs.amazonaws.com AWSServiceRoleForECS
ensure_service_linked_role ecs.application-autoscaling.amazonaws.com \
  AWSServiceRoleForApplicationAutoScaling_ECSService

echo "deploying to account $account, region $region"
npx cdk bootstrap "aws://$account/$region"
npx cdk deploy -c "account=$account" -c "region=$region" ${approval[@]+"${approval[@]}"} "$@"
