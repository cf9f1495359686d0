// Writes tests/agui_schema/ag-ui-1.0.schema.json: the AG-UI 1.0 event schema as JSON
// Schema (draft 2020-12), from the official package's own validators -- @ag-ui/core
// 1.0.0's `@ag-ui/core/schemas` (zod, generated upstream from
// https://ag-ui.com/spec/1.0/schema.json) -- converted by zod's own `z.toJSONSchema`.
// See tests/agui_schema/README.md for why and how.
//
//   (cd tests/agui_client && npm ci && node schema.mjs [out.json])
import { writeFileSync, readFileSync } from "node:fs";
import * as S from "@ag-ui/core/schemas";
import { z } from "zod/v4";

const core = JSON.parse(readFileSync("node_modules/@ag-ui/core/package.json", "utf8"));
const schema = z.toJSONSchema(S.EventSchema, {
  target: "draft-2020-12",
  unrepresentable: "any", // metadata: any JSON object (a zod custom check)
  io: "output",
  reused: "ref",
});

// The 1.0 schema's objects are exact ("a property it does not declare fails
// validation"); the zod validators are loose on purpose (a client tolerates what a newer
// minor version adds). A producer is held to the schema: every object that declares its
// properties is closed, except those the spec keeps open (JSON Patch operations,
// marked `specOpen` in the validators' metadata).
function close(node) {
  if (Array.isArray(node)) return node.forEach(close);
  if (node === null || typeof node !== "object") return;
  if (node.properties && !node.specOpen && JSON.stringify(node.additionalProperties) === "{}") {
    node.additionalProperties = false;
  }
  Object.values(node).forEach(close);
}
close(schema);
schema.$id = "https://ag-ui.com/spec/1.0/schema.json";
schema.title = `AG-UI ${S.PROTOCOL_VERSION} events (from @ag-ui/core ${core.version})`;
const out = process.argv[2] ?? new URL("../agui_schema/ag-ui-1.0.schema.json", import.meta.url);
writeFileSync(
  out,
  JSON.stringify(schema, null, 1) + "\n",
);
