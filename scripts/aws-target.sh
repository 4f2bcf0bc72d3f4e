#!/usr/bin/env bash
# Sourced by deploy.sh and destroy.sh: `fail`, and the account and region of the caller's
# credentials (the same ones `cdk` will use), each missing piece refused in one line.
# Sets: region, account.

fail() {
  echo "error: $*" >&2
  exit 1
}

command -v aws >/dev/null 2>&1 \
  || fail "the AWS CLI is needed (it reads your account and region); install AWS CLI v2"
command -v npx >/dev/null 2>&1 \
  || fail "npx (Node.js) is needed for the pinned CDK CLI; install Node.js 22 or newer (20 works, but is end-of-life)"

region=${AWS_REGION:-${AWS_DEFAULT_REGION:-}}
if [[ -z "$region" ]]; then
  region=$(aws configure get region 2>/dev/null || true)
fi
[[ -n "$region" ]] || fail "no AWS region: set AWS_REGION (or run: aws configure set region <region>)"

account=$(aws sts get-caller-identity --query Account --output text 2>/dev/null) \
  || fail "no usable AWS credentials: 'aws sts get-caller-identity' failed (run aws configure or aws sso login)"
[[ "$account" =~ ^[0-9]{12}$ ]] || fail "aws sts get-caller-identity returned '$account', not an account id"
