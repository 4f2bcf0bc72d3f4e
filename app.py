#!/usr/bin/env python3
"""CDK entry point: the only place that reads context.

The context is read once into a frozen, validated `LeaseworkerConfig`; a bad value stops
synth with one line on stderr naming the parameter, the value and the rule (exit 1).
"""

from __future__ import annotations

import os
import sys

from aws_cdk import App

from stacks.application import build
from stacks.config import ConfigError, load_config, placeholder_account_note


def main() -> int:
    app = App()
    try:
        config = load_config(app.node.try_get_context, app.node.get_all_context())
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    # The CLI sets CDK_DEFAULT_ACCOUNT when it finds credentials; synth itself stays offline.
    note = placeholder_account_note(config, os.environ.get("CDK_DEFAULT_ACCOUNT"))
    if note is not None:
        print(note, file=sys.stderr)
    build(app, config)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
