// The graphql-http server audit (GraphQL over HTTP, https://github.com/graphql/graphql-http) against
// one URL: every audit of `serverAudits` run in turn, each printed as one JSON line
// {"id", "name", "status", "reason"} (status: ok, or notice/warn/error — `error` is a MUST that
// fails), then a summary line {"summary": {"ok": N, "notice": N, "warn": N, "error": N}}.
// Every request is bounded (30 s). Exit status 1 when a MUST fails.
//
//   npm ci && node audit.mjs http://127.0.0.1:8080/graphql
// (tests/gateway/graphql_interop.rs runs it against the graphql-posts example; docs/graphql.md
// "Checked by" lists the results.)
import { serverAudits } from 'graphql-http';

const url = process.argv[2];
if (!url) {
  console.error('usage: node audit.mjs URL');
  process.exit(2);
}
const LIMIT_MS = 30_000;
const fetchFn = (input, init = {}) =>
  fetch(input, { ...init, signal: AbortSignal.timeout(LIMIT_MS) });

const counts = { ok: 0, notice: 0, warn: 0, error: 0 };
for (const audit of serverAudits({ url, fetchFn })) {
  let result;
  try {
    result = await audit.fn();
  } catch (e) {
    // a fatal failure of the audit itself (the server unreachable, a timeout): a failure
    result = { id: audit.id, name: audit.name, status: 'error', reason: String(e) };
  }
  counts[result.status] = (counts[result.status] ?? 0) + 1;
  const line = { id: result.id, name: result.name, status: result.status };
  if (result.status !== 'ok') line.reason = result.reason;
  console.log(JSON.stringify(line));
}
console.log(JSON.stringify({ summary: counts }));
process.exit(counts.error > 0 ? 1 : 0);
