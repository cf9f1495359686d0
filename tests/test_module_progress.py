"""The test run names each module as it finishes (tests/module_progress.py, issue 47.6),
with and without pytest-xdist workers, failures counted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("workers", ["0", "2"])
def test_each_module_is_named_when_its_last_test_is_done(tmp_path: Path, workers: str) -> None:
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import module_progress\n\n"
        "def pytest_configure(config):\n    module_progress.register(config)\n"
    )
    (tmp_path / "test_one.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    (tmp_path / "test_two.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('n', range(3))\n"
        "def test_c(n):\n    assert n != 1\n"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            workers,
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--dist",
            "loadfile",
            "-o",
            "addopts=",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # test_c[1] fails
    lines = run.stdout.splitlines()
    one = [line for line in lines if line.startswith("test_one.py: ")]
    two = [line for line in lines if line.startswith("test_two.py: ")]
    assert len(one) == 1 and one[0].startswith("test_one.py: 2 done, "), run.stdout
    assert len(two) == 1 and two[0].startswith("test_two.py: 1 FAILED of 3, "), run.stdout
    assert sorted(line[-5:] for line in one + two) == ["[1/2]", "[2/2]"]
