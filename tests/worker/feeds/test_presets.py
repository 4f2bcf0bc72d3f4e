"""Presets as data: every shipped preset expands to a generic/1 config the validator accepts, and
its parameters are checked with one-line errors (docs/design.md §4.2 "Presets")."""

from __future__ import annotations

from importlib import resources

import pytest

from leaseworker.protocol.generic import parse_config
from leaseworker.protocol.presets import expand, load, names

SAMPLES: dict[str, dict[str, str]] = {
    "jetstream": {"collections": "app.bsky.feed.post,app.bsky.graph.*", "dids": "did:plc:abc"},
    "coinbase-exchange": {"product_ids": "BTC-USD,ETH-USD"},
    "binance-spot": {"streams": "btcusdt@depth@100ms,btcusdt@trade"},
    "kraken-v2": {"symbols": "BTC/USD,ETH/USD"},
    "alpaca": {"key": "{{env:ALPACA_KEY}}", "secret": "{{secret:alpaca/prod#secret}}", "symbols": "AAPL"},
    "home-assistant": {"url": "wss://home.example.org/api/websocket", "token": "{{secret:ha#token}}"},
}


def test_the_six_presets_ship() -> None:
    assert names() == sorted(SAMPLES)
    for name in names():  # package data: the YAML sits beside the module, with its sources
        text = resources.files("leaseworker.protocol.presets").joinpath(f"{name}.yaml").read_text()
        assert text.startswith("#") and "https://" in text.split("\n\n")[0]
        assert load(name).docs and "url" in load(name).params


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_preset_expands_to_a_valid_config(name: str) -> None:
    config = expand(name, SAMPLES[name])
    parsed = parse_config(config)
    assert "{{param:" not in repr(config)
    assert parsed.connect.url is not None


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_url_points_a_preset_at_another_endpoint(name: str) -> None:
    config = expand(name, {**SAMPLES[name], "url": "ws://127.0.0.1:9999/x"})
    assert config["connect"]["url"].startswith("ws://127.0.0.1:9999/x")


def test_list_params_repeat_or_join_in_the_url() -> None:
    jetstream = expand("jetstream", SAMPLES["jetstream"])["connect"]["url"]
    assert jetstream == (
        "wss://jetstream2.us-east.bsky.network/subscribe?{{#cursor}}cursor={{cursor}}&{{/cursor}}"
        "wantedCollections=app.bsky.feed.post&wantedCollections=app.bsky.graph.*&wantedDids=did:plc:abc"
    )
    assert expand("jetstream", {})["connect"]["url"].endswith(
        "/subscribe?{{#cursor}}cursor={{cursor}}&{{/cursor}}"
    )
    binance = expand("binance-spot", {**SAMPLES["binance-spot"], "url": "ws://127.0.0.1:1/stream?a=1"})
    assert (
        binance["connect"]["url"] == "ws://127.0.0.1:1/stream?a=1&streams=btcusdt@depth@100ms/btcusdt@trade"
    )


def test_list_params_become_json_arrays_in_values() -> None:
    config = expand("coinbase-exchange", {"product_ids": " BTC-USD , ETH-USD ,"})
    assert config["open"][0]["send"]["product_ids"] == ["BTC-USD", "ETH-USD"]
    assert config["open"][0]["send"]["channels"] == ["matches", "heartbeat"]
    assert expand("kraken-v2", {"symbols": "BTC/USD"})["open"][1]["send"]["params"]["channel"] == "trade"


def test_secret_params_keep_their_reference() -> None:
    config = expand("alpaca", SAMPLES["alpaca"])
    auth = config["open"][1]["send"]
    assert auth == {"action": "auth", "key": "{{env:ALPACA_KEY}}", "secret": "{{secret:alpaca/prod#secret}}"}
    assert parse_config(config).references() == {"env:ALPACA_KEY", "secret:alpaca/prod#secret"}
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:alpaca/prod-AbCdEf"
    by_arn = expand("alpaca", {**SAMPLES["alpaca"], "secret": f"{{{{secret:{arn}#secret}}}}"})
    assert parse_config(by_arn).references() == {"env:ALPACA_KEY", f"secret:{arn}#secret"}


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("alpaca", {**SAMPLES["alpaca"], "secret": "hunter2"}, "parameter 'secret' is a secret"),
        ("home-assistant", {**SAMPLES["home-assistant"], "token": "eyJhbGciOi"}, "use"),
        ("home-assistant", {**SAMPLES["home-assistant"], "token": "{{secret:ha}}"}, "use"),  # no #KEY
        ("kraken-v2", {"symbols": "BTC/USD", "depth": "10"}, "no parameter 'depth'"),
        ("kraken-v2", {}, "needs parameter 'symbols'"),
        ("home-assistant", {"token": "{{env:T}}"}, "needs parameter 'url'"),
        ("kraken-v2", {"symbols": "{{env:AWS_SECRET_ACCESS_KEY}}"}, "not allowed"),
        ("coinbase-exchange", {"product_ids": "BTC-USD", "url": "https://x"}, "not a ws:// or wss:// URL"),
        ("binance-spot", {"streams": "BTCUSDT@trade"}, "does not match"),
        ("nope", {}, "unknown preset 'nope'"),
    ],
)
def test_bad_params_are_one_line_errors(name: str, params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        expand(name, params)
    text = str(caught.value)
    assert "\n" not in text
    assert message in text or (message == "use" and "{{secret:NAME#KEY}}" in text)
    assert "hunter2" not in text and "eyJhbGciOi" not in text
