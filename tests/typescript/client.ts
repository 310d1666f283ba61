// A TypeScript client of Flowhook typed only by the served OpenAPI document: `flowhook.d.ts`
// is generated from it by openapi-typescript (tests/e2e/test_typescript_client.py).
import type { paths } from "./flowhook";

type Execute = paths["/api/v1/flows/execute"]["post"];
type Accepted = Execute["responses"][202]["content"]["application/json"];
type Refused = Execute["responses"][400]["content"]["application/json"];
type Run = paths["/api/v1/flows/runs/{run_id}"]["get"]["responses"][200]["content"]["application/json"];

export async function executeAndRead(base: string, key: string, body: Execute["requestBody"]["content"]["application/json"]): Promise<Run> {
  const headers = { Authorization: `Bearer ${key}`, "Content-Type": "application/json" };
  const started = await fetch(`${base}/api/v1/flows/execute`, { method: "POST", headers, body: JSON.stringify(body) });
  const answer: unknown = await started.json();
  if (started.status !== 202) throw new Error(`${(answer as Refused).code}: ${(answer as Refused).error}`);
  const accepted = answer as Accepted;
  const read = await fetch(`${base}/api/v1/flows/runs/${accepted.run_id}?wait=25`, { headers });  // long-poll until it ends
  return (await read.json()) as Run;
}
