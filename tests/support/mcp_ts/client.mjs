import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, key, question] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: "kgstream-ts-check", version: "0.0.0" });
await client.connect(transport);
const tools = await client.listTools();
const result = await client.callTool({ name: "search", arguments: { question, k: 3 } });
console.log(JSON.stringify({
  tools: tools.tools.map((t) => t.name).sort(),
  isError: result.isError ?? false,
  structured: result.structuredContent ?? null,
}));
await client.close();
