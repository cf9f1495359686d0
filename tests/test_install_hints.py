"""Install hints fit the installation at hand (issue 47.6): from a clone installed
editable, ``pip install -e '<clone>[extra]'``; otherwise the package index's name.

Real distribution metadata folders are written (PEP 610 ``direct_url.json`` as pip
writes it) and found through ``importlib.metadata`` on a path of the test's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest

from cantrip._install import install_command


def _dist(root: Path, direct_url: dict[str, object] | None) -> None:
    info = root / "cantrip_runtime-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cantrip-runtime\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


REAL_DISTRIBUTIONS = metadata.distributions


def _look_on(monkeypatch: pytest.MonkeyPatch, *folders: Path) -> None:
    """Distributions are looked up on ``folders`` alone (``importlib.metadata`` is one
    module for everybody: monkeypatch puts it back)."""
    paths = [str(folder) for folder in folders]

    def on_folders(name: str | None = None) -> Iterable[metadata.Distribution]:
        return REAL_DISTRIBUTIONS(name=name, path=paths)

    monkeypatch.setattr(metadata, "distributions", on_folders)


@pytest.fixture
def only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    _look_on(monkeypatch, tmp_path / "site")
    return tmp_path / "site"


def test_an_editable_install_is_told_to_install_from_its_clone(only: Path) -> None:
    _dist(only, {"url": "file:///home/me/my%20clone", "dir_info": {"editable": True}})
    assert install_command("otel") == "pip install -e '/home/me/my clone[otel]'"


def test_a_wheel_install_is_told_the_package_index_name(only: Path) -> None:
    _dist(only, None)
    assert install_command("postgres") == "pip install 'cantrip-runtime[postgres]'"


def test_a_non_editable_direct_install_is_told_the_package_index_name(only: Path) -> None:
    _dist(only, {"url": "https://example.org/cantrip.whl", "archive_info": {}})
    assert install_command("otel") == "pip install 'cantrip-runtime[otel]'"


def test_a_clones_own_egg_info_first_on_the_path_does_not_hide_the_editable_install(
    only: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from inside a clone, the build's ``*.egg-info`` (no direct_url.json) is found
    first; the editable install's record behind it still decides."""
    (only / "first").mkdir(parents=True)
    _dist(only / "first", None)
    _dist(only, {"url": "file:///src/cantrip", "dir_info": {"editable": True}})
    _look_on(monkeypatch, only / "first", only)
    assert install_command("a2a") == "pip install -e '/src/cantrip[a2a]'"


def test_a_malformed_record_falls_back_to_the_index_name(only: Path) -> None:
    info = only / "cantrip_runtime-0.1.0.dist-info"
    _dist(only, None)
    (info / "direct_url.json").write_text("{not json")
    assert install_command("otel") == "pip install 'cantrip-runtime[otel]'"
