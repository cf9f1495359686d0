"""The bash medium under bubblewrap (issue 13, item 7): ``isolation = "bwrap"``.

Escape attempts from inside the sandbox -- writing outside the working folder,
reading another folder, reaching a socket on the host, reading the host's
secrets from the environment or ``/proc`` -- all fail, while the working
folder, gates and ``done`` work as before. Without ``bwrap`` on PATH the
medium refuses to be built, with a message that says how to get it.

These tests need the ``bwrap`` program (Debian package ``bubblewrap``, which
``.ci/run`` installs); they fail, never skip, without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

import gates
from cantrip import Cantrip, Circle, ConstructionError, Identity, ScriptedLLM, max_turns
from cantrip.spec import build_cantrip, parse_spec
from mediums.bash import BashMedium


async def run(medium: BashMedium, *codes: str) -> list[str]:
    circle = Circle([gates.done, gates.echo], [max_turns(len(codes) + 1)], medium)
    llm = ScriptedLLM([{"code": c} for c in codes] + [{"code": "submit_answer fine"}])
    result = await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("escape")
    assert result.result == "fine"  # gates work from inside the sandbox
    return [t.observation for t in result.turns]


async def test_only_the_working_folder_is_writable(tmp_path: Path) -> None:
    workdir, outside = tmp_path / "work", tmp_path / "outside"
    outside.mkdir()
    medium = BashMedium(workdir=workdir, isolation="bwrap")
    [seen, *_] = await run(
        medium,
        f"echo kept > note; echo out > {outside}/w; echo usr > /usr/w; echo root > /w; "
        "echo tmp > /tmp/t && cat /tmp/t",
    )
    assert (workdir / "note").read_text() == "kept\n"
    assert list(outside.iterdir()) == []
    assert f"{outside}/w: No such file or directory" in seen  # the host folder is not there
    assert "/usr/w: Read-only file system" in seen
    assert "/w: Read-only file system" in seen
    assert "tmp" in seen  # a private /tmp, gone with the shell


async def test_other_folders_and_host_secrets_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "secret.txt").write_text("the host's secret")
    monkeypatch.setenv("CANTRIP_TEST_API_KEY", "sk-must-not-leak")
    medium = BashMedium(workdir=tmp_path / "work", isolation="bwrap")
    [seen, *_] = await run(
        medium,
        f"cat {other}/secret.txt; cat /etc/shadow; ls /root /home /work; env; "
        f"test -e /proc/{os.getpid()} && echo host-pid-visible; cat /proc/1/cmdline; echo",
    )
    assert "the host's secret" not in seen
    assert "sk-must-not-leak" not in seen and "CANTRIP_TEST_API_KEY" not in seen
    assert "/etc/shadow: No such file or directory" in seen
    assert "cannot access '/root'" in seen and "cannot access '/work'" in seen
    assert "host-pid-visible" not in seen
    assert "bwrap" in seen  # pid 1 of its own pid namespace: the sandbox, not the host


async def test_no_network_unless_allowed(tmp_path: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED"
    async with trio.open_nursery() as nursery:

        async def accept() -> None:
            while True:
                stream = await listeners[0].accept()
                await stream.aclose()

        nursery.start_soon(accept)
        [closed, *_] = await run(BashMedium(workdir=tmp_path, isolation="bwrap"), probe)
        [opened, *_] = await run(
            BashMedium(workdir=tmp_path, isolation="bwrap", network=True), probe
        )
        nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()
    assert "CONNECTED" not in closed and "Connection refused" in closed
    assert "CONNECTED" in opened


async def test_a_daemon_cannot_outlive_the_session(tmp_path: Path) -> None:
    marker = "cantrip-bwrap-daemon-4711"
    await run(
        BashMedium(workdir=tmp_path, isolation="bwrap"),
        f"setsid bash -c 'exec -a {marker} sleep 600' </dev/null >/dev/null 2>&1 & echo started",
    )

    def survivors() -> list[str]:
        alive = []
        for entry in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if entry.isdigit() and marker.encode() in cmdline:
                alive.append(entry)
        return alive

    # The kernel ends the session's PID namespace when the session closes; on a
    # loaded machine the last process may take a moment to be reaped.
    with trio.move_on_after(5):
        while survivors():
            await trio.sleep(0.05)
    assert survivors() == []


def test_a_missing_bwrap_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    with pytest.raises(ConstructionError) as caught:
        BashMedium(isolation="bwrap")
    message = str(caught.value)
    assert "needs bubblewrap, but the program 'bwrap' is not on PATH" in message
    assert "apt-get install bubblewrap" in message
    with pytest.raises(ConstructionError) as from_spec:
        build_cantrip(
            parse_spec(
                {
                    "llm": {"responses": [{"code": "submit_answer x"}]},
                    "circle": {
                        "medium": "bash",
                        "isolation": "bwrap",
                        "gates": ["done"],
                        "wards": [{"max_turns": 2}],
                    },
                }
            )
        )
    assert "circle: isolation='bwrap' needs bubblewrap" in str(from_spec.value)


async def test_the_spec_file_key_turns_isolation_on(tmp_path: Path) -> None:
    spell = build_cantrip(
        parse_spec(
            {
                "llm": {"responses": [{"code": "echo hi > /usr/x; submit_answer $?"}]},
                "circle": {
                    "medium": "bash",
                    "isolation": "bwrap",
                    "gates": ["done"],
                    "wards": [{"max_turns": 2}],
                },
            }
        )
    )
    assert isinstance(spell.circle.medium, BashMedium)
    assert spell.circle.medium.isolation == "bwrap"
    result = await spell.cast_async("try")
    assert result.result == "1"
    assert "Read-only file system" in result.turns[0].observation
