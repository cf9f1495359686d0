// The official AG-UI JavaScript client (@ag-ui/client's HttpAgent) against a live
// `cantrip serve`: tests/test_agui_client.py starts the server, runs this script and
// asserts on what it prints (one JSON document on stdout).
//
//   node run.mjs <url> <scenario> [token]
//
// Scenarios: "chat" (two runs on one thread), "approve" (a run that pauses for an
// approval, then runs that resume it until the cast ends), "tools" (a front-end tool
// the model calls and this client runs), "abort" (the client aborts mid-run),
// "reconnect" (the client loses the run after 6 events and a second client comes back
// for the rest: the same run sent again with Last-Event-ID; the url asks
// ?reconnect_s=, so the hang-up does not cancel the cast).
import { HttpAgent, verifyEvents } from "@ag-ui/client";
import { from, lastValueFrom, toArray } from "rxjs";

const [url, scenario, token] = process.argv.slice(2);

// Aborting a run rejects the client's in-flight fetch; when that rejection lands after
// runAgent has settled it is unhandled, and node would exit 1 on it. An AbortError is
// what "abort" asks for: say it on stderr and go on; anything else still fails the run.
process.on("unhandledRejection", (reason) => {
  if ((scenario === "abort" || scenario === "reconnect") && reason && reason.name === "AbortError") {
    process.stderr.write(`late abort rejection: ${reason.message}\n`);
    return;
  }
  process.stderr.write(`unhandled rejection: ${reason && reason.stack ? reason.stack : reason}\n`);
  process.exit(1);
});
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const agent = new HttpAgent({ url, headers, threadId: `js-${scenario}-${Date.now()}` });
const runs = [];
const LOST_AFTER = 6;
let aborted = false;

async function run(text, params = {}) {
  if (text !== null) {
    agent.addMessage({ id: `u${runs.length}`, role: "user", content: text });
  }
  const events = [];
  const record = { events, error: null, finished: null };
  runs.push(record);
  try {
    const result = await agent.runAgent(params, {
      onEvent({ event }) {
        if (scenario === "reconnect" && aborted && event.type === "RUN_ERROR") {
          record.aborted = event.message; // the client's own word for its abort
          return;
        }
        events.push(event);
        if (scenario === "abort" && event.type === "TOOL_CALL_START") {
          agent.abortRun();
        }
        if (scenario === "reconnect" && runs.length === 1 && events.length === LOST_AFTER) {
          aborted = true;
          agent.abortRun();
        }
      },
      onRunFinishedEvent(params) {
        record.finished = { outcome: params.outcome, interrupts: params.interrupts ?? null };
      },
    });
    record.result = result.result ?? null;
  } catch (error) {
    record.error = String(error && error.message ? error.message : error);
  }
  return record;
}

if (scenario === "chat") {
  await run("weather in Oslo?");
  await run("and tomorrow?");
} else if (scenario === "approve") {
  // approve every interrupt, run after run, until the cast ends (at most 4 resumes)
  let last = await run("launch it");
  for (let i = 0; i < 4 && last.finished && last.finished.outcome === "interrupt"; i++) {
    const resume = agent.pendingInterrupts.map((p) => ({
      interruptId: p.id,
      status: "resolved",
      payload: true,
    }));
    last = await run(null, { resume });
  }
} else if (scenario === "tools") {
  // a front-end tool: the model calls it, this client runs it and sends the result
  const tools = [
    {
      name: "get_location",
      description: "Where the user is (the browser knows).",
      parameters: { type: "object", properties: { precision: { type: "string" } } },
    },
  ];
  await run("where am I?", { tools });
  const call = agent.messages.flatMap((m) => m.toolCalls ?? []).at(-1);
  if (call && call.function.name === "get_location") {
    agent.addMessage({ id: "t1", role: "tool", toolCallId: call.id, content: "Oslo, Norway" });
    await run(null, { tools });
  }
} else if (scenario === "abort") {
  await run("wait forever");
} else if (scenario === "reconnect") {
  const runId = `run-reconnect-${Date.now()}`;
  await run("wait for it", { runId });
  // A run's event ids are their places in it (RUN_STARTED is 0): the last one this
  // client had is the number it received, less one.
  const back = new HttpAgent({
    url,
    headers: { ...headers, "Last-Event-ID": String(runs[0].events.length - 1) },
    threadId: agent.threadId,
    initialMessages: [{ id: "u0", role: "user", content: "wait for it" }],
  });
  // The official client's transport and parser (HttpAgent.run) read the resumed
  // response; its run verifier (verifyEvents) then checks what this client holds --
  // the events it had and those after them -- as one run.
  const record = { events: [], error: null, finished: null, verified: null };
  runs.push(record);
  try {
    const input = {
      threadId: agent.threadId,
      runId,
      messages: back.messages,
      state: {},
      tools: [],
      context: [],
      forwardedProps: {},
    };
    record.events = await lastValueFrom(back.run(input).pipe(toArray()));
    const whole = [...runs[0].events, ...record.events.slice(1)];
    record.verified = (await lastValueFrom(from(whole).pipe(verifyEvents(), toArray()))).length;
    const last = whole.at(-1);
    record.finished = last.type === "RUN_FINISHED" ? { outcome: last.outcome?.type ?? "success" } : null;
    record.result = last.result ?? null;
  } catch (error) {
    record.error = String(error && error.message ? error.message : error);
  }
}

process.stdout.write(
  JSON.stringify({
    threadId: agent.threadId,
    runs,
    messages: agent.messages,
    state: agent.state,
    pendingInterrupts: agent.pendingInterrupts,
  }),
);
