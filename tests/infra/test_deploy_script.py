"""scripts/deploy.sh and destroy.sh against stub `aws`, `docker` and `npx` on a bare PATH: no real AWS."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.infra.conftest import REPO

SCRIPT = REPO / "scripts" / "deploy.sh"
DESTROY = REPO / "scripts" / "destroy.sh"
CI = ("--require-approval", "never")  # what a deploy without a terminal must choose

# Each stub logs its argv to $STUB_LOG; behaviour is steered by environment variables.
AWS_STUB = """#!/bin/bash
echo "aws $*" >> "$STUB_LOG"
case "$1 $2" in
  "configure get") [[ -n "${STUB_CONFIG_REGION:-}" ]] && echo "$STUB_CONFIG_REGION" && exit 0; exit 1 ;;
  "sts get-caller-identity") [[ -n "${STUB_NO_CREDENTIALS:-}" ]] && exit 255; echo 123456789012 ;;
  "iam get-role")
    if [[ " ${STUB_ROLES:-} " == *" $4 "* ]]; then echo '{"Role": {}}'; exit 0; fi
    echo "An error occurred (NoSuchEntity) when calling the GetRole operation: not found" >&2
    exit 254 ;;
  "iam create-service-linked-role")
    if [[ "$4" == "${STUB_SLR_ERROR_FOR:-}" || -n "${STUB_NO_CREATE_PERMISSION:-}" ]]; then
      echo "An error occurred (AccessDenied) when calling the CreateServiceLinkedRole operation: denied" >&2
      exit 254
    fi
    if [[ "$4" == "${STUB_SLR_TAKEN:-}" ]]; then
      echo "" >&2
      echo "An error occurred (InvalidInput) when calling the CreateServiceLinkedRole operation:"\
" Service role name AWSServiceRoleForECS has been taken in this account, please try a different suffix." >&2
      exit 254
    fi
    echo '{"Role": {}}' ;;
esac
"""
DOCKER_STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STUB_LOG"
[[ -z "${STUB_ENGINE_DOWN:-}" ]]
"""
NPX_STUB = """#!/bin/bash
echo "npx $*" >> "$STUB_LOG"
"""


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("aws", AWS_STUB), ("docker", DOCKER_STUB), ("finch", DOCKER_STUB), ("npx", NPX_STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run(
    stubs: Path, *args: str, without: tuple[str, ...] = (), script: Path = SCRIPT, **env: str
) -> subprocess.CompletedProcess[str]:
    for name in without:
        (stubs / name).unlink()
    log = stubs.parent / "calls.log"
    log.touch()
    # /usr/bin and /bin hold bash and coreutils, not docker or the AWS CLI.
    base = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(stubs.parent), "STUB_LOG": str(log)}
    result = subprocess.run(
        ["bash", str(script), *args],
        env=base | env,
        stdin=subprocess.DEVNULL,  # no terminal, as in CI
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    result.calls = log.read_text().splitlines()  # type: ignore[attr-defined]
    return result


def assert_one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "npx cdk" not in "\n".join(result.calls)  # type: ignore[attr-defined]


def test_no_stub_leaks_from_the_machine() -> None:
    env = {"PATH": "/usr/bin:/bin"}
    for tool in ("docker", "aws"):
        found = subprocess.run(
            ["bash", "-c", f"command -v {tool}"], env=env, capture_output=True, check=False
        )
        assert found.returncode != 0, f"{tool} in /usr/bin would defeat these tests"


def test_missing_docker_is_one_line(stubs: Path) -> None:
    result = run(stubs, without=("docker",), AWS_REGION="eu-west-1")
    assert_one_line_error(result, "'docker' was not found")
    assert "CDK_DOCKER" in result.stderr


def test_cdk_docker_is_used_instead_of_docker(stubs: Path) -> None:
    result = run(stubs, *CI, without=("docker",), AWS_REGION="eu-west-1", CDK_DOCKER="finch")
    assert result.returncode == 0, result.stderr
    assert "finch info" in result.calls  # type: ignore[attr-defined]


def test_missing_cdk_docker_cli_is_named(stubs: Path) -> None:
    result = run(stubs, AWS_REGION="eu-west-1", CDK_DOCKER="podman")
    assert_one_line_error(result, "'podman' was not found")


def test_stopped_engine_is_one_line(stubs: Path) -> None:
    result = run(stubs, AWS_REGION="eu-west-1", STUB_ENGINE_DOWN="1")
    assert_one_line_error(result, "'docker info' failed")


def test_missing_region_is_one_line(stubs: Path) -> None:
    result = run(stubs)
    assert_one_line_error(result, "no AWS region")


def test_region_from_aws_configure(stubs: Path) -> None:
    result = run(stubs, *CI, STUB_CONFIG_REGION="ap-southeast-2")
    assert result.returncode == 0, result.stderr
    assert "npx cdk bootstrap aws://123456789012/ap-southeast-2" in result.calls  # type: ignore[attr-defined]


def test_missing_aws_cli_is_one_line(stubs: Path) -> None:
    assert_one_line_error(run(stubs, without=("aws",), AWS_REGION="eu-west-1"), "the AWS CLI is needed")


def test_no_credentials_is_one_line(stubs: Path) -> None:
    result = run(stubs, AWS_REGION="eu-west-1", STUB_NO_CREDENTIALS="1")
    assert_one_line_error(result, "no usable AWS credentials")


def test_deploy_creates_both_roles_idempotently_then_bootstraps_and_deploys(stubs: Path) -> None:
    result = run(stubs, "-c", "stage=prod", *CI, AWS_REGION="eu-west-1", STUB_SLR_TAKEN="ecs.amazonaws.com")
    assert result.returncode == 0, result.stderr
    calls = [c for c in result.calls if not c.startswith("docker")]  # type: ignore[attr-defined]
    assert calls == [
        "aws sts get-caller-identity --query Account --output text",
        "aws iam get-role --role-name AWSServiceRoleForECS",
        "aws iam create-service-linked-role --aws-service-name ecs.amazonaws.com",
        "aws iam get-role --role-name AWSServiceRoleForApplicationAutoScaling_ECSService",
        "aws iam create-service-linked-role --aws-service-name ecs.application-autoscaling.amazonaws.com",
        "npx cdk bootstrap aws://123456789012/eu-west-1",
        # The caller's approval policy replaces the interactive default.
        "npx cdk deploy -c account=123456789012 -c region=eu-west-1 -c stage=prod --require-approval never",
    ]
    assert "the service-linked role for ecs.amazonaws.com exists" in result.stdout
    assert "created the service-linked role for ecs.application-autoscaling.amazonaws.com" in result.stdout


def test_other_service_linked_role_errors_stop_in_one_line(stubs: Path) -> None:
    result = run(
        stubs, *CI, AWS_REGION="eu-west-1", STUB_SLR_ERROR_FOR="ecs.application-autoscaling.amazonaws.com"
    )
    assert_one_line_error(result, "could not create the service-linked role for ecs.application-autoscaling")
    assert "AccessDenied" in result.stderr


def test_makefile_deploy_runs_the_script() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ndeploy:", 1)[1].split("\n\n", 1)[0]
    assert "scripts/deploy.sh" in recipe
    assert os.access(SCRIPT, os.X_OK)


def test_existing_roles_need_no_create_permission(stubs: Path) -> None:
    """A deployer without iam:CreateServiceLinkedRole, in an account that has both roles."""
    roles = "AWSServiceRoleForECS AWSServiceRoleForApplicationAutoScaling_ECSService"
    result = run(stubs, *CI, AWS_REGION="eu-west-1", STUB_ROLES=roles, STUB_NO_CREATE_PERMISSION="1")
    assert result.returncode == 0, result.stderr
    assert not [c for c in result.calls if "create-service-linked-role" in c]  # type: ignore[attr-defined]
    assert result.stdout.count("exists") == 2


def test_no_terminal_and_no_approval_policy_is_one_line(stubs: Path) -> None:
    result = run(stubs, "-c", "stage=prod", AWS_REGION="eu-west-1")
    assert_one_line_error(result, 'DEPLOY_ARGS="--require-approval never"')
    assert not [c for c in result.calls if "iam" in c]  # type: ignore[attr-defined]


def test_a_terminal_gets_the_interactive_approval(stubs: Path, tmp_path: Path) -> None:
    import pexpect

    log = tmp_path / "calls.log"
    child = pexpect.spawn(
        "bash",
        [str(SCRIPT), "-c", "stage=prod"],
        env={
            "PATH": f"{stubs}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "STUB_LOG": str(log),
            "AWS_REGION": "eu-west-1",
        },
        encoding="utf-8",
        timeout=60,
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert log.read_text().splitlines()[-1] == (
        "npx cdk deploy -c account=123456789012 -c region=eu-west-1 --require-approval broadening"
        " -c stage=prod"
    )


def test_destroy_deletes_the_dev_stack_of_the_callers_account(stubs: Path) -> None:
    result = run(stubs, script=DESTROY, AWS_REGION="eu-west-1")
    assert result.returncode == 0, result.stderr
    assert result.calls[-1] == (  # type: ignore[attr-defined]
        "npx cdk destroy --force -c account=123456789012 -c region=eu-west-1"
    )
    assert "destroying Leaseworker-dev in account 123456789012, region eu-west-1" in result.stdout


@pytest.mark.parametrize(
    "stage", [("-c", "stage=prod"), ("--context", "stage=prod"), ("--context=stage=prod",)]
)
def test_destroy_refuses_prod_unless_explicit(stubs: Path, stage: tuple[str, ...]) -> None:
    result = run(stubs, *stage, script=DESTROY, AWS_REGION="eu-west-1")
    assert_one_line_error(result, "refusing to destroy Leaseworker-prod")
    assert "ALLOW_PROD_DESTROY=Leaseworker-prod" in result.stderr
    assert result.calls == []  # type: ignore[attr-defined]
    allowed = run(
        stubs, *stage, script=DESTROY, AWS_REGION="eu-west-1", ALLOW_PROD_DESTROY="Leaseworker-prod"
    )
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.calls[-1].startswith("npx cdk destroy --force")  # type: ignore[attr-defined]


def make_dry_run(target: str) -> str:
    """Every recipe `make TARGET` would run from scratch (-B: all out of date; -n: run nothing)."""
    result = subprocess.run(
        ["make", "-n", "-B", target], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    return result.stdout


@pytest.mark.parametrize("target", ["synth", "deploy", "destroy", "cost"])
def test_cdk_targets_need_only_the_cdk_venv_and_node_modules(target: str) -> None:
    recipes = make_dry_run(target)
    assert "pip install --quiet -r requirements.txt" in recipes
    for test_only in ("check-java", "install-test-tools", "requirements-dev", "worker_src"):
        assert test_only not in recipes, (target, test_only)
    if target != "cost":
        assert "npm ci" in recipes


def test_demo_installs_the_worker_and_dynamodb_local_only() -> None:
    recipes = make_dry_run("demo")
    assert "-e worker_src -e dev_src" in recipes and "npm ci" in recipes and "check-java" in recipes
    for not_needed in ("requirements-dev", "install-test-tools", "-r requirements.txt"):
        assert not_needed not in recipes, not_needed


def test_test_target_still_installs_everything() -> None:
    recipes = make_dry_run("test")
    for needed in ("requirements-dev", "check-java", "install-test-tools", "npm ci"):
        assert needed in recipes, needed
