// The official MCP TypeScript SDK's client against a live `cantrip mcp` (stdio), for
// tests/test_mcp_ts_client.py. Usage: node run.mjs CANTRIP SPEC INTENT [ANSWER_JSON...]
// Each ANSWER_JSON answers one elicitation, in order. Prints one JSON report.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [cantrip, spec, intent, ...answers] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: cantrip, args: ["mcp", spec], stderr: "inherit" });
let version = null;
const setVersion = transport.setProtocolVersion?.bind(transport);
transport.setProtocolVersion = (v) => { version = v; setVersion?.(v); };
const client = new Client(
  { name: "cantrip-ts-test", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params);
  const next = answers.shift();
  return next ? JSON.parse(next) : { action: "cancel" };
});
await client.connect(transport);
const tools = await client.listTools();
const progress = [];
const result = await client.callTool(
  { name: "cast", arguments: { intent } },
  undefined,
  { onprogress: (p) => progress.push(p), timeout: 60000 },
);
console.log(JSON.stringify({
  version,
  server: client.getServerVersion(),
  tools: tools.tools.map((t) => t.name),
  progress,
  result,
  asked,
}));
await client.close();
