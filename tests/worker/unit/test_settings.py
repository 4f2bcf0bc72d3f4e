"""Every settings rule: a broken one is refused with one line naming variable, value and rule."""

from __future__ import annotations

import math

import pytest

from leaseworker.settings import (
    Settings,
    SettingsError,
    default_worker_id,
    load_settings,
    max_clock_skew_ms_from,
)

BASE = {"WORKER_ID": "w1"}


def load(**env: str) -> Settings:
    return load_settings({**BASE, **env})


def test_defaults_match_design() -> None:
    settings = load()
    assert settings.table_name == "leaseworker-connections"
    assert settings.lease_mode == "session"  # docs/design.md §2b: the default once session mode exists
    assert (settings.lease_seconds, settings.heartbeat_seconds) == (20.0, 5.0)
    assert (settings.reconcile_seconds, settings.checkpoint_seconds) == (5.0, 5.0)
    assert settings.max_clock_skew_ms == 1000
    assert settings.max_connections == 1000
    assert settings.metrics_seconds == 30.0
    assert settings.shutdown_grace_seconds == 60.0
    assert settings.sink == "stdout"
    assert settings.notify_queue_url is None and settings.otel_endpoint is None
    assert settings.allow_insecure_ws is False


@pytest.mark.parametrize(
    ("env", "name", "rule"),
    [
        ({"TABLE_NAME": ""}, "TABLE_NAME", "is required"),
        ({"LEASE_MODE": "zookeeper"}, "LEASE_MODE", "one of connection, session"),
        ({"LEASE_SECONDS": "abc"}, "LEASE_SECONDS", "must be a number"),
        ({"LEASE_SECONDS": "14"}, "LEASE_SECONDS", ">= 3 x HEARTBEAT_SECONDS (15)"),
        ({"HEARTBEAT_SECONDS": "0"}, "HEARTBEAT_SECONDS", "must be > 0"),
        ({"HEARTBEAT_SECONDS": "-1"}, "HEARTBEAT_SECONDS", "must be > 0"),
        ({"RECONCILE_SECONDS": "0"}, "RECONCILE_SECONDS", "must be > 0"),
        ({"CHECKPOINT_SECONDS": "0"}, "CHECKPOINT_SECONDS", "must be > 0"),
        ({"METRICS_SECONDS": "0"}, "METRICS_SECONDS", "must be > 0"),
        ({"MAX_CONNECTIONS": "0"}, "MAX_CONNECTIONS", "must be > 0"),
        ({"MAX_CONNECTIONS": "1.5"}, "MAX_CONNECTIONS", "must be an integer"),
        ({"MAX_CLOCK_SKEW_MS": "5000"}, "MAX_CLOCK_SKEW_MS", "< LEASE_SECONDS/4 (5000 ms)"),
        ({"MAX_CLOCK_SKEW_MS": "-1"}, "MAX_CLOCK_SKEW_MS", ">= 0"),
        ({"MAX_CLOCK_SKEW_MS": "ten"}, "MAX_CLOCK_SKEW_MS", "must be an integer"),
        ({"SHUTDOWN_GRACE_SECONDS": "121"}, "SHUTDOWN_GRACE_SECONDS", "<= 120"),
        ({"SHUTDOWN_GRACE_SECONDS": "0"}, "SHUTDOWN_GRACE_SECONDS", "must be > 0"),
        ({"SINK": "s3:bucket"}, "SINK", "stdout, null, file:<dir> or kinesis:<stream>"),
        ({"SINK": "kinesis:"}, "SINK", "kinesis:<stream>"),
        ({"SINK": "file:"}, "SINK", "file:<dir>"),
        ({"WORKER_ID": "has space"}, "WORKER_ID", "[A-Za-z0-9._:-]"),
        ({"WORKER_ID": "x" * 129}, "WORKER_ID", "[A-Za-z0-9._:-]{1,128}"),
        ({"ALLOW_INSECURE_WS": "maybe"}, "ALLOW_INSECURE_WS", "true or false"),
    ],
)
def test_each_rule(env: dict[str, str], name: str, rule: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load(**env)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"invalid {name}=")
    assert repr(env[name]) in message or env[name] in message
    assert rule in message


def test_valid_scaled_timings_and_overrides() -> None:
    settings = load(LEASE_SECONDS="3", HEARTBEAT_SECONDS="1", MAX_CLOCK_SKEW_MS="200", SINK="null")
    assert settings.local_validity_seconds == pytest.approx(3 - 0.2 - 0.3)
    assert load_settings({**BASE, "SINK": "null"}, sink="file:/tmp/x").sink == "file:/tmp/x"
    assert load(ALLOW_INSECURE_WS="true").allow_insecure_ws is True
    assert load(AWS_ENDPOINT_URL_DYNAMODB="http://a", AWS_ENDPOINT_URL="http://b").endpoint_url == "http://a"


def test_settings_are_frozen() -> None:
    settings = load()
    with pytest.raises(AttributeError):
        settings.lease_seconds = 1  # type: ignore[misc]  # proving the dataclass is frozen


def test_default_worker_id_local_and_ecs() -> None:
    local = default_worker_id({})
    assert local.count("-") >= 2
    assert load_settings({}).worker_id  # generated when unset
    ecs = default_worker_id({"ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/0123abcd4567-1111"})
    assert ecs.startswith("0123abcd4567-")
    assert default_worker_id({}) != default_worker_id({})  # random suffix


def test_session_mode_refuses_more_connections_than_one_checkpoint_item_holds() -> None:
    with pytest.raises(SettingsError, match=r"invalid MAX_CONNECTIONS=1118: must be <= 1117 in session mode"):
        load(LEASE_MODE="session", MAX_CONNECTIONS="1118")
    assert load(LEASE_MODE="connection", MAX_CONNECTIONS="2535").max_connections == 2535


NUMERIC_VARIABLES = [
    "LEASE_SECONDS",
    "HEARTBEAT_SECONDS",
    "RECONCILE_SECONDS",
    "CHECKPOINT_SECONDS",
    "MAX_CLOCK_SKEW_MS",
    "MAX_CONNECTIONS",
    "METRICS_SECONDS",
    "SHUTDOWN_GRACE_SECONDS",
]
NOT_FINITE = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "-Infinity", "1e999", "-1e999", " nan "]


@pytest.mark.parametrize("value", NOT_FINITE)
@pytest.mark.parametrize("name", NUMERIC_VARIABLES)
def test_nan_and_infinity_are_refused_in_one_line(name: str, value: str) -> None:
    """NaN compares false with every bound, so without its own rule it would pass all of them."""
    with pytest.raises(SettingsError) as caught:
        load(**{name: value})
    assert str(caught.value) == f"invalid {name}={value!r}: must be a finite number, not NaN or infinity"


FIELDS = {
    "LEASE_SECONDS": "lease_seconds",
    "HEARTBEAT_SECONDS": "heartbeat_seconds",
    "RECONCILE_SECONDS": "reconcile_seconds",
    "CHECKPOINT_SECONDS": "checkpoint_seconds",
    "MAX_CLOCK_SKEW_MS": "max_clock_skew_ms",
    "MAX_CONNECTIONS": "max_connections",
    "METRICS_SECONDS": "metrics_seconds",
    "SHUTDOWN_GRACE_SECONDS": "shutdown_grace_seconds",
}


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", NUMERIC_VARIABLES)
def test_a_settings_object_refuses_non_finite_numbers_too(name: str, number: float) -> None:
    """The rule is in validate(), so a Settings built in code (tests, the local fleet) gets it too."""
    assert set(FIELDS) == set(NUMERIC_VARIABLES)
    with pytest.raises(SettingsError) as caught:
        Settings(worker_id="w1", **{FIELDS[name]: number})  # type: ignore[arg-type]  # proving the rule
    assert str(caught.value) == f"invalid {name}={number!r}: must be a finite number, not NaN or infinity"


def test_huge_but_finite_integers_are_judged_by_their_rules() -> None:
    # Connection mode: session mode caps MAX_CONNECTIONS by its checkpoint item.
    assert load(LEASE_MODE="connection", MAX_CONNECTIONS="1" + "0" * 400).max_connections == 10**400
    with pytest.raises(SettingsError, match=r"MAX_CLOCK_SKEW_MS.*< LEASE_SECONDS/4"):
        load(MAX_CLOCK_SKEW_MS="1" + "0" * 400)


def test_the_cli_reads_the_clock_skew_alone() -> None:
    assert max_clock_skew_ms_from({}) == 1000
    assert max_clock_skew_ms_from({"MAX_CLOCK_SKEW_MS": "250"}) == 250
    for value, rule in (("nan", "must be a finite number"), ("-1", "must be >= 0"), ("x", "an integer")):
        with pytest.raises(SettingsError, match=rule):
            max_clock_skew_ms_from({"MAX_CLOCK_SKEW_MS": value})
