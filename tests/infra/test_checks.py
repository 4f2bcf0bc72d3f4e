"""cdk-nag (zero unacknowledged findings), cfn-lint, and the real entry points run offline."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import Validations
from aws_cdk.assertions import Annotations, Match

from stacks import nag
from tests.infra.conftest import REPO, Synth, make_app, normalise

# The acknowledged cdk-nag findings: (construct path, rule id). Each reason is asserted below.
ACKNOWLEDGED = {
    ("Leaseworker-dev/Workers/TaskDefinition/TaskRole/DefaultPolicy", "AwsSolutions-IAM5[Resource::*]"),
    ("Leaseworker-dev/Workers/TaskDefinition/ExecutionRole/DefaultPolicy", "AwsSolutions-IAM5[Resource::*]"),
    ("Leaseworker-dev/Workers/TaskDefinition", "AwsSolutions-ECS2"),
}


def test_nag_zero_unacknowledged_findings(default: Synth) -> None:
    # The fixture's synth ran the AwsSolutions plugin and would have raised ValidationFailed.
    annotations = Annotations.from_stack(default.stack)
    assert annotations.find_error("*", Match.any_value()) == []
    report = default.outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            assert plugin["conclusion"] == "success", plugin


def test_every_acknowledgement_is_known_and_has_a_reason(default: Synth) -> None:
    found: set[tuple[str, str]] = set()
    for construct in default.stack.node.find_all():
        for entry in construct.node.metadata:
            if entry.type != Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                continue
            for key, reason in entry.data.items():
                # Stored as "Annotation::<id>" by Validations.acknowledge.
                rule_id = key.removeprefix("Annotation::")
                if rule_id.startswith("AwsSolutions"):
                    assert len(reason) >= nag.MIN_REASON_LENGTH, (construct.node.path, rule_id)
                    found.add((construct.node.path, rule_id))
    assert found == ACKNOWLEDGED


def test_acknowledge_refuses_an_empty_reason() -> None:
    with pytest.raises(ValueError, match="needs a real reason"):
        nag.acknowledge(None, "AwsSolutions-ECS2", "because")  # type: ignore[arg-type]


@pytest.mark.parametrize(("path", "rule_id"), sorted(ACKNOWLEDGED))
def test_removing_an_acknowledgement_fails_synth(
    monkeypatch: pytest.MonkeyPatch, path: str, rule_id: str
) -> None:
    """The nag check can fail: drop one acknowledgement and its finding surfaces."""
    original = nag.acknowledge

    def skip_one(scope: Any, rule: str, reason: str) -> None:
        if rule == rule_id and scope.node.path == path:
            return
        original(scope, rule, reason)

    monkeypatch.setattr(nag, "acknowledge", skip_one)
    app, _, outdir = make_app()
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((outdir / "validation-report.json").read_text())
    (awssolutions,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    assert awssolutions["conclusion"] == "failure"
    violations = {
        (v["ruleName"], c["constructPath"])
        for v in awssolutions["violations"]
        for c in v["violatingConstructs"]
    }
    assert violations == {(rule_id, f"{path}/Resource")}


def run_cfn_lint(template: dict[str, Any], directory: Path) -> subprocess.CompletedProcess[str]:
    path = directory / "template.json"
    path.write_text(json.dumps(template))
    return subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--format", "parseable", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_cfn_lint_clean(default: Synth, custom: Synth, tmp_outdir: Path) -> None:
    for synth in (default, custom):
        resources = synth.template_json["Resources"].values()
        assert all(
            "aws:cdk:path" in r.get("Metadata", {}) for r in resources if r["Type"] != "AWS::CDK::Metadata"
        )
        result = run_cfn_lint(synth.template_json, tmp_outdir)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_cfn_lint_can_fail(default: Synth, tmp_outdir: Path) -> None:
    broken = copy.deepcopy(default.template_json)
    table_id = next(k for k, r in broken["Resources"].items() if r["Type"] == "AWS::DynamoDB::Table")
    broken["Resources"][table_id]["Properties"]["BillingMode"] = "FREE"
    result = run_cfn_lint(broken, tmp_outdir)
    assert result.returncode != 0
    assert "E3030" in result.stdout  # BillingMode not one of the allowed values


# --- The real entry points, as subprocesses, offline and without credentials --------------


# The virtualenv running these tests, as an activated virtualenv puts it: first on PATH.
VENV_BIN = Path(sys.executable).parent


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_", "VIRTUAL_ENV"))}
    env.update(
        {
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
            "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
            "CDK_DISABLE_VERSION_CHECK": "1",
        }
    )
    return env


def cdk(*args: str, outdir: Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    npx = shutil.which("npx")
    assert npx, "npx (Node.js) is required"
    return subprocess.run(
        [npx, "--no-install", "cdk", *args, "--output", str(outdir)],
        cwd=cwd,
        env=offline_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_app_py_bad_context_prints_one_line(tmp_outdir: Path) -> None:
    env = offline_env() | {
        "CDK_CONTEXT_JSON": json.dumps({"leaseSeconds": "abc"}),
        "CDK_OUTDIR": str(tmp_outdir),
    }
    result = subprocess.run(
        [sys.executable, "app.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["invalid context leaseSeconds='abc': must be an integer"]
    assert "Traceback" not in result.stdout + result.stderr


def test_cdk_synth_bad_context_fails_with_one_line(tmp_outdir: Path) -> None:
    result = cdk("synth", "--quiet", "-c", "stopTimeoutSeconds=300", outdir=tmp_outdir)
    assert result.returncode != 0
    expected = (
        "invalid context stopTimeoutSeconds=300: must be between 2 and 120 (the Fargate stopTimeout limit)"
    )
    assert result.stderr.count(expected) == 1
    assert "Traceback" not in result.stdout + result.stderr


def test_cdk_synth_refuses_a_misspelled_key_with_the_nearest_one(tmp_outdir: Path) -> None:
    """Through the real CLI, which adds its own keys (aws:cdk:*, cli-telemetry, the AZ facts):
    only ours is refused, in one line, naming the key it meant."""
    result = cdk("synth", "--quiet", "-c", "leaseSecond=30", outdir=tmp_outdir)
    assert result.returncode != 0
    expected = (
        "invalid context leaseSecond='30': unknown context key, did you mean `leaseSeconds`? "
        "(every parameter: docs/infrastructure.md#context-parameters)"
    )
    assert result.stderr.count(expected) == 1, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_outdir / "Leaseworker-dev.template.json").exists()


def test_cdk_synth_works_offline_and_matches_the_tested_template(default: Synth, tmp_outdir: Path) -> None:
    result = cdk("synth", "--quiet", outdir=tmp_outdir)
    assert result.returncode == 0, result.stderr
    template = json.loads((tmp_outdir / "Leaseworker-dev.template.json").read_text())
    # The CLI turns on version reporting (the AWS::CDK::Metadata resource); nothing else differs.
    assert template["Resources"].pop("CDKMetadata")["Type"] == "AWS::CDK::Metadata"
    template.get("Conditions", {}).pop("CDKMetadataAvailable", None)
    if not template.get("Conditions", True):
        del template["Conditions"]
    # The in-process synth these tests inspect is the template the CLI produces.
    assert normalise(template) == normalise(default.template_json)
    manifest = json.loads((tmp_outdir / "manifest.json").read_text())
    assert "missing" not in manifest  # no context lookups needed: cdk.context.json has them


def test_cdk_json_app_uses_the_python_on_path() -> None:
    """The `cdk init` convention: an activated virtualenv anywhere, not a ./.venv."""
    app = json.loads((REPO / "cdk.json").read_text())["app"]
    assert app == "python3 app.py"
    assert ".venv" not in app


def test_cdk_synth_with_an_activated_virtualenv_outside_the_project(tmp_path: Path) -> None:
    """A project directory without .venv; the virtualenv is found only through PATH."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("app.py", "cdk.json", "cdk.context.json"):
        shutil.copy(REPO / name, project / name)
    for name in ("stacks", "worker_src", "node_modules"):
        (project / name).symlink_to(REPO / name)
    assert not (project / ".venv").exists()
    result = cdk("synth", "--quiet", outdir=tmp_path / "out", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "Leaseworker-dev.template.json").is_file()
