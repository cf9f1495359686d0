"""What ``cantrip`` the command sets for its process and the library never does: the
descriptor limit raised so an adapter may hold a connection per entity in flight."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

resource = pytest.importorskip("resource")  # POSIX (the suite runs on Linux)


def _soft_after(script: str) -> int:
    """Run ``script`` in a fresh interpreter whose soft limit starts at 256; its last line."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    prelude = f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, {hard}))
    """
    env = {**os.environ, "OPENAI_API_KEY": "test-key"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(prelude) + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_the_command_raises_the_soft_descriptor_limit_to_the_hard_one() -> None:
    from cantrip.cli._process import OPEN_FILES_CAP

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_CAP)
    assert want > 256, "the hard limit leaves nothing to raise"
    soft = _soft_after("""
        import contextlib, io, resource
        from cantrip.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["--help"])
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """)
    assert soft == want


def test_importing_cantrip_leaves_the_limit_alone() -> None:
    soft = _soft_after("""
        import resource
        import cantrip
        from cantrip.llm import load_llm
        load_llm("openai", base_url="http://127.0.0.1:9/v1")
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """)
    assert soft == 256


def test_a_hard_limit_at_the_soft_one_is_left_as_it_is() -> None:
    soft = _soft_after("""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # nothing above to raise to
        from cantrip.cli._process import raise_open_files_limit
        print(raise_open_files_limit())
    """)
    assert soft == 256
