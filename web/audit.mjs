// The GraphQL-over-HTTP audit (graphql-http's serverAudits) against a running server.
// Usage: node web/audit.mjs URL TOKEN  -> one JSON line per audit, then a summary line
// {"summary": {"MUST": {"ok": n, ...}, "SHOULD": {...}, "MAY": {...}}}.
import { serverAudits } from 'graphql-http';

const [url, token] = process.argv.slice(2);
// Every request of this service carries a token (CONTRACT 2): the audit's requests too.
const fetchFn = (input, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set('authorization', `Bearer ${token}`);
  return fetch(input, { ...init, headers });
};
const summary = {};
for (const audit of serverAudits({ url, fetchFn })) {
  const result = await audit.fn();
  const level = audit.name.split(' ')[0];
  summary[level] ??= { ok: 0, warn: 0, error: 0 };
  summary[level][result.status] += 1;
  console.log(JSON.stringify({ id: audit.id, name: audit.name, status: result.status,
    reason: result.status === 'ok' ? undefined : result.reason }));
}
console.log(JSON.stringify({ summary }));
