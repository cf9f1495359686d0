"""The README's Python examples run as written (documentation is part of the work)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("one\ntwo\n")
    prelude = "import cantrip\nfrom gates import done\n" if index else ""
    script = tmp_path / f"example_{index}.py"
    script.write_text(prelude + BLOCKS[index], encoding="utf-8")
    runpy.run_path(str(script), run_name="__main__")
    if index == 0:
        out = capsys.readouterr().out
        assert "said hello True 2" in out and "done too 2" in out
