"""Evals on the loom: suites, evaluators, record and replay, reports, ``cantrip eval``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from fake_providers import Answer, Call, isolate, running

import cantrip
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip.evals import (
    Case,
    Expect,
    ReplayLLM,
    Suite,
    add_case,
    compare,
    load_suite,
    replay_llm,
    run_suite,
)
from cantrip.evals._report import table
from cantrip.llm._telemetry import Pricing
from gates import done, echo

CLI = [sys.executable, "-m", "cantrip"]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

SPEC = """
[llm]
provider = "scripted"
responses = [
    { tool_calls = [{ gate = "echo", args = { text = "Hello, world!" } }] },
    { tool_calls = [{ gate = "done", args = { answer = "I greeted the world." } }] },
]
[identity]
system_prompt = "You are a friendly greeter."
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 5 }]
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def greeter(tmp_path: Path, prompt: str = "You are a friendly greeter.") -> Path:
    return write(tmp_path / "spec.toml", SPEC.replace("You are a friendly greeter.", prompt))


def eval_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.run(
        [*CLI, "eval", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


# -- suites ------------------------------------------------------------------------


def test_the_issue_s_suite_form_loads_with_the_spec_relative_to_the_suite(tmp_path: Path) -> None:
    (tmp_path / "evals").mkdir()
    suite = load_suite(
        write(
            tmp_path / "evals" / "suite.yaml",
            """
            spec: ../hello.toml
            cases:
              - name: greets
                intent: Greet the world, then finish.
                expect:
                  result_contains: greeted
                  gates: [echo, done]
                  max_turns: 3
            """,
        )
    )
    assert suite.spec == tmp_path / "evals" / ".." / "hello.toml"
    assert suite.cases[0].expect.gates == ["echo", "done"]


def test_a_malformed_suite_names_each_case_and_field_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path / "bad.yaml",
        """
        cases:
          - name: one
            intent: Do it.
            expect: { max_turns: many }
          - name: two
            expect: { result_contain: x }
          - intent: no name
        """,
    )
    with pytest.raises(cantrip.ConstructionError) as caught:
        load_suite(path)
    problems = caught.value.problems
    assert any("case 'two': unknown expectation 'result_contain'" in p for p in problems)
    assert any("did you mean 'result_contains'" in p for p in problems)
    assert any("result_matches" in p and "known:" in p for p in problems)  # the known ones


def test_field_errors_name_the_case_and_the_field(tmp_path: Path) -> None:
    path = write(
        tmp_path / "bad.yaml",
        """
        cases:
          - name: one
            intent: Do it.
            expect: { max_turns: many }
          - intent: no name
        """,
    )
    with pytest.raises(cantrip.ConstructionError) as caught:
        load_suite(path)
    text = "\n".join(caught.value.problems)
    assert "case 'one': expect.max_turns: must be a whole number" in text
    assert "case #2: name: is required" in text


def test_a_suite_that_is_not_yaml_says_so_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "cases: [\n")
    with pytest.raises(cantrip.ConstructionError, match="not valid YAML"):
        load_suite(path)


def test_toml_suites_load_too(tmp_path: Path) -> None:
    suite = load_suite(
        write(
            tmp_path / "s.toml",
            """
            spec = "spec.toml"
            [[cases]]
            name = "greets"
            intent = "Greet."
            expect = { result_contains = "greeted" }
            """,
        )
    )
    assert suite.cases[0].expect.result_contains == "greeted"


# -- evaluators --------------------------------------------------------------------


async def run_one(tmp_path: Path, expect: Expect, **options: object) -> dict[str, object]:
    suite = Suite([Case(name="c", intent="Greet the world.", expect=expect)])
    report = await run_suite(suite, spec=greeter(tmp_path), **options)  # type: ignore[arg-type]
    result = report.to_dict()["cases"][0]["results"][0]
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize(
    ("expect", "passed", "message"),
    [
        (Expect(result_equals="I greeted the world."), True, ""),
        (Expect(result_equals="nope"), False, "not 'nope'"),
        (Expect(result_contains=["greeted", "world"]), True, ""),
        (Expect(result_contains="waved"), False, "lacks 'waved'"),
        (Expect(result_matches=r"^I \w+ed"), True, ""),
        (Expect(result_matches=r"^waved"), False, "does not match"),
        (Expect(result_schema={"type": "string", "minLength": 3}), True, ""),
        (Expect(result_schema={"type": "object"}), False, 'is not of type "object"'),
        (Expect(gates=["echo", "done"]), True, ""),
        (Expect(gates=["done", "echo"]), False, "no call to echo in order"),
        (Expect(gates=[{"gate": "echo", "args": {"text": "Hello, world!"}}]), True, ""),  # type: ignore[list-item]
        (Expect(gates=[{"gate": "echo", "args": {"text": "Bye"}}]), False, "no call to echo"),  # type: ignore[list-item]
        (Expect(gates_never=["read"]), True, ""),
        (Expect(gates_never=["echo"]), False, "called echo"),
        (Expect(max_turns=2, min_turns=2), True, ""),
        (Expect(max_turns=1), False, "took 2 turns (max 1)"),
        (Expect(ended="terminated", reason="done"), True, ""),
        (Expect(ended="truncated"), False, "the cast terminated (done), not truncated"),
        (Expect(max_latency_s=60), True, ""),
        (Expect(max_tokens=0), True, ""),
    ],
)
async def test_each_evaluator_passes_and_fails_with_a_reason(
    tmp_path: Path, expect: Expect, passed: bool, message: str
) -> None:
    result = await run_one(tmp_path, expect)
    assert result["status"] == ("passed" if passed else "failed")
    failed = [c for c in result["checks"] if not c["passed"]]  # type: ignore[attr-defined]
    assert bool(failed) is not passed
    if message:
        assert message in failed[0]["message"]


def test_function_evaluators_run_the_user_s_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path / "my_checks.py",
        """
        def short(outcome):
            return len(outcome.text) < 100
        def polite(outcome):
            return ("please" in outcome.text, "no please in " + outcome.text)
        def broken(outcome):
            raise RuntimeError("boom")
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ok = cantrip_run(tmp_path, Expect(function="my_checks:short"))
    assert ok["status"] == "passed"
    no = cantrip_run(tmp_path, Expect(function=["my_checks:short", "my_checks:polite"]))
    assert no["status"] == "failed"
    assert "no please in I greeted the world." in json.dumps(no["checks"])


def cantrip_run(tmp_path: Path, expect: Expect) -> dict[str, object]:
    import trio

    return trio.run(lambda: run_one(tmp_path, expect))


async def test_an_evaluator_that_raises_errors_its_case_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "raising.py", "def broken(outcome):\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    suite = Suite(
        [
            Case(name="bad", intent="Greet.", expect=Expect(function="raising:broken")),
            Case(name="missing", intent="Greet.", expect=Expect(function="raising:nothing")),
            Case(name="good", intent="Greet.", expect=Expect(result_contains="greeted")),
        ]
    )
    report = await run_suite(suite, spec=greeter(tmp_path))
    status = {r.case: r for r in report.runs}
    assert status["bad"].status == "errored"
    assert "raising:broken raised RuntimeError: boom" in (status["bad"].error or "")
    assert status["missing"].status == "errored"
    assert "has no function 'nothing'" in (status["missing"].error or "")
    assert status["good"].status == "passed"


async def test_the_judge_gives_a_verdict_with_reasoning_and_its_own_cost(tmp_path: Path) -> None:
    def verdict(passed: bool, why: str) -> dict[str, object]:
        return {"tool_calls": [{"gate": "verdict", "args": {"passed": passed, "reasoning": why}}]}

    def judge(passed: bool, why: str) -> ScriptedLLM:
        return ScriptedLLM(
            [verdict(passed, why)],
            usage=cantrip.Usage(prompt_tokens=1000, completion_tokens=100),
            pricing=Pricing(input=1.0, output=2.0),
        )

    suite = Suite(
        [
            Case(
                name="c",
                intent="Greet.",
                expect=Expect(judge={"rubric": "Greets warmly", "llm": "j"}),
            )
        ]  # type: ignore[arg-type]
    )
    kind = judge(True, "it greets")
    good = await run_suite(suite, spec=greeter(tmp_path), judges={"j": kind})
    bad = await run_suite(suite, spec=greeter(tmp_path), judges={"j": judge(False, "too curt")})
    assert good.runs[0].status == "passed" and bad.runs[0].status == "failed"
    assert "judge: too curt" in bad.runs[0].why
    assert good.runs[0].checks[0].detail["reasoning"] == "it greets"
    assert good.runs[0].judge_cost_usd == pytest.approx(0.0012)
    summary = good.to_dict()["summary"]
    assert summary["judge_cost_usd"] == pytest.approx(0.0012)
    assert summary["cost_usd"] == 0.0  # the agent's own cost, counted apart
    system, data = kind.invocations[0].messages
    assert "Rubric:\nGreets warmly" in (system.content or "")
    assert json.loads(data.content or "") == {"task": "Greet.", "answer": "I greeted the world."}


async def test_a_judge_without_a_verdict_errors_the_case(tmp_path: Path) -> None:
    mute = ScriptedLLM([{"content": "Looks fine to me."}])
    expect = Expect(judge={"rubric": "Warm", "llm": "j"})  # type: ignore[arg-type]
    suite = Suite([Case(name="c", intent="Greet.", expect=expect)])
    report = await run_suite(suite, spec=greeter(tmp_path), judges={"j": mute})
    assert report.runs[0].status == "errored"
    assert "the judge gave no verdict (it wrote 'Looks fine to me.')" in (
        report.runs[0].error or ""
    )
    unknown = Suite(
        [Case(name="c", intent="Greet.", expect=Expect(judge={"rubric": "W", "llm": "x"}))]
    )  # type: ignore[arg-type]
    report = await run_suite(unknown, spec=greeter(tmp_path))
    assert "judge llm 'x' is not configured" in (report.runs[0].error or "")


# -- record and replay -------------------------------------------------------------


async def test_record_then_replay_offline_without_a_key_or_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate(monkeypatch, tmp_path)
    answers = [
        Answer(calls=(Call("echo", {"text": "hi"}),)),
        Answer(calls=(Call("done", {"answer": "greeted"}),)),
    ]
    suite = Suite([Case(name="greets", intent="Greet.", expect=Expect(gates=["echo", "done"]))])
    recording = tmp_path / "rec.jsonl"
    async with running("openai", answers, model="gpt-4o-mini") as (fake, llm):

        def build(loom: Loom) -> Cantrip:
            return Cantrip(
                llm=llm,
                identity=Identity(system_prompt="Greeter."),
                circle=Circle([done, echo], [max_turns(4)]),
                loom=loom,
            )

        live = await run_suite(suite, cantrip=build, record=recording)
        assert live.passed and len(fake.requests) == 2
    monkeypatch.delenv("OPENAI_API_KEY")

    def offline(loom: Loom) -> Cantrip:
        return Cantrip(
            llm=ScriptedLLM([]),  # would raise if asked: the replay answers instead
            identity=Identity(system_prompt="Greeter."),
            circle=Circle([done, echo], [max_turns(4)]),
            loom=loom,
        )

    replayed = await run_suite(suite, cantrip=offline, replay=recording, repeat=3)
    assert replayed.passed and len(replayed.runs) == 3
    assert replayed.runs[0].tokens == 2 * (11 + 7)  # the recorded usage, replayed


async def test_replay_matches_by_conversation_under_concurrency_and_repeats(tmp_path: Path) -> None:
    spec = greeter(tmp_path)
    recording = tmp_path / "rec.jsonl"
    cases = [Case(name=f"c{i}", intent=f"Greet person {i}.") for i in range(12)]
    await run_suite(Suite(cases), spec=spec, record=recording, concurrency=1)
    report = await run_suite(Suite(cases), spec=spec, replay=recording, concurrency=8, repeat=4)
    assert report.passed and len(report.runs) == 48
    assert {r.result for r in report.runs} == {"I greeted the world."}


async def test_a_changed_prompt_diverges_naming_the_turn_and_the_difference(tmp_path: Path) -> None:
    recording = tmp_path / "rec.jsonl"
    suite = Suite([Case(name="greets", intent="Greet.")])
    await run_suite(suite, spec=greeter(tmp_path), record=recording)
    changed = greeter(tmp_path, "You are a grumpy greeter.")
    report = await run_suite(suite, spec=changed, replay=recording)
    run = report.runs[0]
    assert run.status == "failed"
    assert run.error is not None and "replay diverged at turn 1" in run.error
    assert "grumpy greeter" in run.error and "friendly greeter" in run.error


async def test_a_changed_gate_result_diverges_at_the_next_turn(tmp_path: Path) -> None:
    recording = tmp_path / "rec.jsonl"
    suite = Suite([Case(name="greets", intent="Greet.")])

    def spell(echo_gate: cantrip.Gate) -> object:
        def build(loom: Loom) -> Cantrip:
            return Cantrip(
                llm=ScriptedLLM(
                    [
                        {"tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
                        {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
                    ]
                ),
                identity=Identity(system_prompt="Greeter."),
                circle=Circle([done, echo_gate], [max_turns(4)]),
                loom=loom,
            )

        return build

    await run_suite(suite, cantrip=spell(echo), record=recording)  # type: ignore[arg-type]

    @cantrip.gate(name="echo")
    def loud_echo(text: str) -> str:
        return text.upper()

    report = await run_suite(suite, cantrip=spell(loud_echo), replay=recording)  # type: ignore[arg-type]
    error = report.runs[0].error or ""
    assert "replay diverged at turn 2" in error and "'HI'" in error and "'hi'" in error


async def test_a_removed_gate_diverges_where_the_recording_calls_it(tmp_path: Path) -> None:
    recording = tmp_path / "rec.jsonl"
    suite = Suite([Case(name="greets", intent="Greet.")])
    await run_suite(suite, spec=greeter(tmp_path), record=recording)

    def without_echo(loom: Loom) -> Cantrip:
        return Cantrip(
            llm=ScriptedLLM([]),
            identity=Identity(system_prompt="You are a friendly greeter."),
            circle=Circle([done], [max_turns(5)]),
            loom=loom,
        )

    report = await run_suite(suite, cantrip=without_echo, replay=recording)
    assert "calls echo, which this circle no longer offers" in (report.runs[0].error or "")


async def test_replay_llm_is_stateless_and_raises_on_an_unknown_conversation() -> None:
    llm = replay_llm(Loom())
    assert isinstance(llm, ReplayLLM)
    with pytest.raises(cantrip.LLMError, match="the recording holds no answers"):
        await llm.query([cantrip.Message("user", "hi")])


async def test_a_budgeted_cast_replays_at_its_recorded_cost() -> None:
    """A replay reports each answer's recorded cost (as OpenRouter reports its own):
    a spec with a ``max_cost_usd`` ward replays as it ran, not refused for the replay
    LLM having no price of its own (issue 39, item 16), and costs what it cost."""

    def spell(llm: cantrip.LLM, loom: Loom) -> Cantrip:
        wards = [max_turns(5), cantrip.max_cost_usd(1.0)]
        return Cantrip(llm=llm, identity=Identity(), circle=Circle([done, echo], wards), loom=loom)

    script = [
        {"tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
    ]
    priced = ScriptedLLM(script, usage=cantrip.Usage(1000, 0), pricing=Pricing(1.0, 2.0))
    recording = Loom()
    recorded = await spell(priced, recording).cast_async("Go.")
    assert recorded.terminated and recorded.cost_usd == pytest.approx(0.002)
    replayed = await spell(replay_llm(recording), Loom()).cast_async("Go.")
    assert (replayed.terminated, replayed.result) == (True, "ok")
    assert [t.metadata.cost_usd for t in replayed.turns] == [pytest.approx(0.001)] * 2
    assert replayed.cost_usd == pytest.approx(0.002)


# -- a recorded cast becomes a case -------------------------------------------------


async def test_eval_add_turns_a_recorded_cast_into_a_replayable_case(tmp_path: Path) -> None:
    production = Loom.open(tmp_path / "prod.db")
    spell = Cantrip(
        llm=ScriptedLLM(
            [
                {"tool_calls": [{"gate": "echo", "args": {"text": "bug"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "wrong answer"}}]},
            ]
        ),
        identity=Identity(system_prompt="You are a friendly greeter."),
        circle=Circle([done, echo], [max_turns(5)]),
        loom=production,
    )
    seen = await spell.cast_async("Reproduce the bug.")
    suite_path = tmp_path / "regressions.yaml"
    case = add_case(production, seen.entity_id, suite_path, name="the-bug")
    production.close()
    assert case.intent == "Reproduce the bug."
    suite = load_suite(suite_path)
    assert suite.recording == tmp_path / "regressions.recording.jsonl"
    assert suite.cases[0].expect.result_equals == "wrong answer"

    def same(loom: Loom) -> Cantrip:
        return Cantrip(
            llm=ScriptedLLM([]),
            identity=Identity(system_prompt="You are a friendly greeter."),
            circle=Circle([done, echo], [max_turns(5)]),
            loom=loom,
        )

    report = await run_suite(suite, cantrip=same, replay=suite.recording)
    assert report.passed, report.runs
    # a second case appends to the same file and recording, comments kept
    suite_path.write_text("# my regressions\n" + suite_path.read_text(), encoding="utf-8")
    again = Loom.open(tmp_path / "prod.db")
    spell2 = Cantrip(
        llm=ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "x"}}]}]),
        identity=Identity(system_prompt="You are a friendly greeter."),
        circle=Circle([done, echo], [max_turns(5)]),
        loom=again,
    )
    other = await spell2.cast_async("Another.")
    add_case(again, other.entity_id, suite_path, name="second")
    again.close()
    assert suite_path.read_text().startswith("# my regressions")
    assert [c.name for c in load_suite(suite_path).cases] == ["the-bug", "second"]
    with pytest.raises(cantrip.CantripError, match="exists already"):
        add_case(Loom.open(tmp_path / "prod.db"), other.entity_id, suite_path, name="second")


# -- reports, the cost cap, the command ---------------------------------------------


async def test_repeats_report_pass_rates_flaky_cases_and_percentiles(tmp_path: Path) -> None:
    spec = write(
        tmp_path / "flaky.toml",
        SPEC.replace("I greeted the world.", "greeted"),
    )
    write(
        tmp_path / "coin.py",
        "import itertools\n_n = itertools.count()\n"
        "def flip(outcome):\n    return next(_n) % 2 == 0\n",
    )
    sys.path.insert(0, str(tmp_path))
    try:
        suite = Suite([Case(name="coin", intent="Go.", expect=Expect(function="coin:flip"))])
        report = await run_suite(suite, spec=spec, repeat=4, concurrency=1)
    finally:
        sys.path.remove(str(tmp_path))
    case = report.to_dict()["cases"][0]
    assert (case["runs"], case["passed"], case["pass_rate"]) == (4, 2, 0.5)
    assert case["flaky"] and case["pass_at_k"] == 1.0 and case["pass_all_k"] == 0.0
    assert case["turns"] == {"mean": 2.0, "p95": 2.0}
    assert report.to_dict()["summary"]["flaky"] == ["coin"]
    # the table shows what the guide promises for --repeat (issue 47.6)
    shown = table(report).splitlines()
    assert shown[0].split()[3:5] == ["pass@4", "pass^4"]
    assert shown[1].split()[:6] == ["coin", "(flaky)", "2/4", "50%", "yes", "no"]
    assert shown[-1] == "pass@4 100% of cases (any run passed); pass^4 0% (all did)"


@pytest.mark.parametrize("missing", [True, False])
async def test_max_tokens_fails_when_the_provider_reported_no_usage(missing: bool) -> None:
    """A call whose provider reported no usage used an unknown number of tokens: a
    token budget cannot be shown kept, so ``max_tokens`` fails, as ``max_cost_usd``
    fails on an unknown cost (issue 39, item 16). Zero tokens reported still passes."""

    def agent(loom: Loom) -> Cantrip:
        llm = ScriptedLLM(
            [
                {"tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
                {
                    "tool_calls": [{"gate": "done", "args": {"answer": "ok"}}],
                    "usage": {"prompt_tokens": 7},
                },
            ],
            usage=cantrip.Usage(missing=True) if missing else cantrip.Usage(),
        )
        return Cantrip(
            llm=llm, identity=Identity(), circle=Circle([done, echo], [max_turns(3)]), loom=loom
        )

    suite = Suite([Case(name="c", intent="Go.", expect=Expect(max_tokens=1000))])
    report = await run_suite(suite, cantrip=agent)
    run = report.runs[0]
    if missing:
        assert run.status == "failed"
        assert run.why == (
            "used at least 7 tokens and an unknown number more: the provider reported no "
            "usage for a call (max 1000)"
        )
    else:
        assert run.status == "passed" and run.tokens == 7


async def test_the_run_s_cost_cap_stops_starting_cases(tmp_path: Path) -> None:
    def priced(loom: Loom) -> Cantrip:
        llm = ScriptedLLM(
            [{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}],
            usage=cantrip.Usage(prompt_tokens=1_000_000, completion_tokens=0),
            pricing=Pricing(input=1.0, output=1.0),
        )
        return Cantrip(
            llm=llm, identity=Identity(), circle=Circle([done], [max_turns(3)]), loom=loom
        )

    suite = Suite([Case(name=f"c{i}", intent="Go.") for i in range(5)])
    report = await run_suite(suite, cantrip=priced, concurrency=1, max_cost_usd=2.5)
    statuses = [r.status for r in report.runs]
    assert statuses == ["passed", "passed", "passed", "skipped", "skipped"]
    assert "cost cap ($2.5) was spent" in (report.runs[3].error or "")


def test_the_command_passes_fails_and_reports(tmp_path: Path) -> None:
    greeter(tmp_path)
    write(
        tmp_path / "suite.yaml",
        """
        spec: spec.toml
        cases:
          - name: greets
            intent: Greet the world, then finish.
            expect: { result_contains: greeted, gates: [echo, done], max_turns: 3 }
          - name: waves
            intent: Wave.
            expect: { result_contains: waved }
        """,
    )
    out = eval_cli(
        "suite.yaml", "--record", "rec.jsonl", "--json", "a.json", "--junit", "a.xml", cwd=tmp_path
    )
    assert out.returncode == 1, out.stderr
    assert "FAILED waves: result 'I greeted the world.' lacks 'waved'" in out.stdout
    assert "1 passed, 1 failed" in out.stdout
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["schema"] == "cantrip.eval/1" and report["mode"] == "record"
    assert [c["name"] for c in report["cases"]] == ["greets", "waves"]
    suite_xml = ET.parse(tmp_path / "a.xml").getroot()[0]
    assert suite_xml.get("tests") == "2" and suite_xml.get("failures") == "1"
    # replay is offline and deterministic: the same verdicts
    again = eval_cli("suite.yaml", "--replay", "rec.jsonl", "--json", "b.json", cwd=tmp_path)
    assert again.returncode == 1 and "FAILED waves" in again.stdout
    same = eval_cli("compare", "a.json", "b.json", cwd=tmp_path)
    assert same.returncode == 0 and "greets: same" in same.stdout


def test_compare_lists_regressions_and_exits_1() -> None:
    def report(rate: float, cost: float) -> dict[str, object]:
        stats = {"mean": cost, "p95": cost}
        return {
            "schema": "cantrip.eval/1",
            "summary": {"pass_rate": rate, "cost_usd": cost, "tokens": 10},
            "cases": [
                {
                    "name": "a",
                    "pass_rate": rate,
                    "cost_usd": stats,
                    "tokens": stats,
                    "latency_s": stats,
                },
            ],
        }

    result = compare(report(1.0, 0.01), report(0.5, 0.02))
    assert result["regressions"] == ["a"]
    assert result["cost_usd"]["delta"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.yaml"], "missing.yaml: no such suite file"),
        (["suite.yaml", "--repeat", "0"], "--repeat must be at least 1"),
        (["suite.yaml", "--replay"], "the suite names no 'recording'"),
        (["suite.yaml", "--replay", "nope.jsonl"], "nope.jsonl: no such recording"),
        (["compare", "a.json"], "takes two JSON reports"),
        (["add", "x.db"], "takes a loom and a reference"),
        (["bad.yaml"], "case 'x': unknown expectation 'gate'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    greeter(tmp_path)
    write(tmp_path / "suite.yaml", "spec: spec.toml\ncases: [{name: a, intent: Go.}]\n")
    write(tmp_path / "bad.yaml", "cases: [{name: x, intent: Go., expect: {gate: [done]}}]\n")
    out = eval_cli(*args, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_the_shipped_example_suite_passes_offline_through_replay(tmp_path: Path) -> None:
    out = eval_cli(EXAMPLES / "evals" / "hello.yaml", "--replay", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed, 0 failed" in out.stdout


# -- in users' own test suites ------------------------------------------------------


def test_users_test_their_agents_offline_with_cantrip_testing(tmp_path: Path) -> None:
    greeter(tmp_path)
    recording = tmp_path / "rec.jsonl"
    import trio

    trio.run(
        lambda: run_suite(
            Suite([Case(name="c", intent="Greet the world.")]),
            spec=tmp_path / "spec.toml",
            record=recording,
        )
    )
    write(
        tmp_path / "test_agent.py",
        """
        from cantrip.testing import cast_spec, expect, scripted

        def test_scripted():
            result = cast_spec("spec.toml", "Greet.", llm=scripted(
                {"tool_calls": [{"gate": "done", "args": {"answer": "greeted"}}]},
            ))
            expect(result, result_contains="greeted", gates=["done"], max_turns=1)

        def test_replayed():
            result = cast_spec("spec.toml", "Greet the world.", replay="rec.jsonl")
            expect(result, result_equals="I greeted the world.", gates=["echo", "done"])

        def test_fails_with_reasons():
            result = cast_spec("spec.toml", "Greet the world.", replay="rec.jsonl")
            expect(result, gates_never=["echo"], max_turns=1)

        def test_a_changed_intent_diverges():
            cast_spec("spec.toml", "Something new.", replay="rec.jsonl")
        """,
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_agent.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "2 failed, 2 passed" in out.stdout, out.stdout[-3000:]
    assert "gates_never: called echo; max_turns: took 2 turns (max 1)" in out.stdout
    assert "replay diverged at turn 1" in out.stdout


def test_a_result_schema_that_could_stall_is_refused_when_the_suite_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.yaml",
        """
        cases:
          - name: risky
            intent: Go.
            expect: { result_schema: { type: string, pattern: "^(a)\\\\1$" } }
          - name: remote
            intent: Go.
            expect: { result_schema: { $ref: "http://example.invalid/s.json" } }
        """,
    )
    with pytest.raises(cantrip.ConstructionError) as caught:
        load_suite(path)
    text = "\n".join(caught.value.problems)
    assert "case 'risky': expect.result_schema: the schema cannot be used" in text
    assert "case 'remote': expect.result_schema:" in text and "never retrieves" in text


def test_eval_add_on_the_command_line_writes_the_spec_so_replay_runs_next(tmp_path: Path) -> None:
    """``eval add`` from the command line leaves a suite the next ``eval --replay`` runs
    (issue 47.6): the spec is required for a suite that names none, and written relative
    to the suite file, which here lives in another folder than the spec and the caller."""
    spec = greeter(tmp_path)
    cast = subprocess.run(
        [*CLI, "cast", "--loom", "prod.db", "--json", str(spec), "Greet the world."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cast.returncode == 0, cast.stderr
    entity = json.loads(cast.stdout)["entity_id"]
    (tmp_path / "suites").mkdir()
    suite = Path("suites") / "regressions.yaml"

    refused = eval_cli("add", "prod.db", entity, "--suite", suite, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "names no spec" in refused.stderr and "--spec SPEC" in refused.stderr
    assert not (tmp_path / suite).exists()

    added = eval_cli("add", "prod.db", entity, "--suite", suite, "--spec", spec.name, cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert "spec: ../spec.toml" in (tmp_path / suite).read_text()
    replayed = eval_cli(suite.name, "--replay", cwd=tmp_path / "suites")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "1 passed, 0 failed" in replayed.stdout, replayed.stdout
