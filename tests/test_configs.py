"""Every shipped config validates, and the demo config runs on data that ships with the deps."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedflock.validation import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 8


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_validates(path: Path) -> None:
    config = load_config(path)
    assert config.rounds > 0
    assert config.data.clients >= config.data.scenario.groups


def test_demo_needs_no_data_files() -> None:
    demo = load_config(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert demo.data.dataset in {"mnist5k", "digits"}
