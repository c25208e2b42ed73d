// The SDK's errors: one class per family of the gateway's problem codes,
// and the parsing of the gateway's RFC 9457 problem documents into them.
import type { components } from "./openapi.js";

/**
 * A problem document as the gateway answers it (api/openapi.yaml's
 * `Problem`), with any extension member a newer gateway adds.
 */
export type Problem = components["schemas"]["Problem"] & Record<string, unknown>;

/** The call an error comes from. */
export type Op = "acquire" | "renew" | "release" | "write";

/**
 * The gateway's problem codes this SDK knows. The set is open: a newer
 * gateway may answer a code not listed here; `FencegwError.code` then
 * carries it as is, and the error is a plain `FencegwError`.
 */
export const Codes = {
  invalidRequest: "invalid_request",
  missingLease: "missing_lease",
  unauthorized: "unauthorized",
  forbidden: "forbidden",
  unknownLease: "unknown_lease",
  leaseNotOwned: "lease_not_owned",
  resourceMismatch: "resource_mismatch",
  notFound: "not_found",
  unknownUpstream: "unknown_upstream",
  leaseHeld: "lease_held",
  leaseLost: "lease_lost",
  staleToken: "stale_token",
  leaseExpired: "lease_expired",
  leaseReleased: "lease_released",
  bodyTooLarge: "body_too_large",
  keyInProgress: "idempotency_key_in_progress",
  outcomeUnknown: "idempotency_outcome_unknown",
  keyMismatch: "idempotency_key_mismatch",
  rateLimited: "rate_limited",
  tooManyLeases: "too_many_leases",
  upstreamUnreachable: "upstream_unreachable",
  upstreamTimeout: "upstream_timeout",
  fenceBusy: "fence_busy",
  fenceLost: "fence_lost",
  storeUnavailable: "store_unavailable",
} as const;

/** Every `type` of a problem the gateway itself answers starts with this; an upstream's own problems do not. */
const problemTypePrefix = "urn:fencegw:problem:";

interface ErrorInit {
  op: Op;
  status?: number;
  code?: string;
  problem?: Problem | undefined;
  retryAfterMs?: number;
  cause?: unknown;
}

/**
 * The base of every error the SDK throws for a gateway answer, for a
 * gateway that did not answer, or for a lease that ran out.
 *
 * - `code`: the gateway problem's `code` (`"stale_token"`, ...), or `""`
 *   when there is no gateway problem (no answer, a bare status, a lease
 *   that ran out on the local clock);
 * - `status`: the HTTP status, 0 when the gateway did not answer;
 * - `problem`: the whole problem document, extension members included;
 * - `op`: `"acquire"`, `"renew"`, `"release"` or `"write"`.
 */
export class FencegwError extends Error {
  readonly op: Op;
  readonly status: number;
  readonly code: string;
  readonly problem: Problem | undefined;
  /** The gateway's Retry-After in milliseconds; 0 if it gave none. */
  readonly retryAfterMs: number;

  constructor(message: string, init: ErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.op = init.op;
    this.status = init.status ?? 0;
    this.code = init.code ?? "";
    this.problem = init.problem;
    this.retryAfterMs = init.retryAfterMs ?? 0;
  }

  /** The gateway's Retry-After in seconds (fractional); 0 if it gave none. */
  get retryAfter(): number {
    return this.retryAfterMs / 1000;
  }

  /** The problem's resource, where it names one. */
  get resource(): string | undefined {
    return this.problem?.resource;
  }

  /** The token the refused write or lease carried (stale errors). */
  get token(): number | undefined {
    return this.problem?.token;
  }

  /** The resource's current token (stale and held errors). */
  get currentToken(): number | undefined {
    return this.problem?.current_token;
  }

  /** Who holds the resource (held errors). */
  get holder(): string | undefined {
    return this.problem?.holder;
  }

  /** Until when the resource is held (held errors). */
  get expiresAt(): Date | undefined {
    return this.problem?.expires_at === undefined ? undefined : new Date(this.problem.expires_at);
  }
}

/**
 * The lease is no longer held: the gateway said so (`lease_lost`, or
 * `not_found` on renew or release), a fenced write under it was refused as
 * stale (then it is a `StaleLeaseError`), or its TTL ran out on the local
 * monotonic clock without a successful renewal (`code` is then `""`).
 * It is the `reason` of a lost lease's `signal`.
 */
export class LeaseLostError extends FencegwError {}

/**
 * The gateway refused a fenced write because its lease is not the
 * resource's current one (`stale_token`, `lease_expired`,
 * `lease_released`, `unknown_lease`). The write did not reach the upstream;
 * the gateway recorded the refusal. The lease is lost: its signal fires.
 * Never retried.
 */
export class StaleLeaseError extends LeaseLostError {}

/**
 * Acquire found the resource held by another lease (`lease_held`).
 * `holder` and `expiresAt` say by whom and until when; `retryAfter` (s) and
 * `retryAfterMs` when to try again.
 */
export class LeaseHeldError extends FencegwError {}

/**
 * The gateway could not serve the call: it answered 503 (`store_unavailable`,
 * `fence_busy`, `fence_lost`; see `retryAfterMs`), or it did not answer at
 * all (connection refused or broken, no answer in time: `status` 0). A
 * gateway that is down makes calls unavailable; it does not make a lease
 * lost until the lease's TTL has run out without a renewal.
 */
export class UnavailableError extends FencegwError {}

/**
 * The gateway admitted a fenced write but got no answer from the upstream
 * (`upstream_unreachable` 502, `upstream_timeout` 504). After a timeout the
 * write may still land.
 */
export class UpstreamError extends FencegwError {}

/**
 * A fenced write with an Idempotency-Key was forwarded once and its outcome
 * is unknown (`idempotency_outcome_unknown`); the gateway never forwards
 * that key again. It may have been applied: read the upstream's state.
 */
export class OutcomeUnknownError extends FencegwError {}

const staleCodes = new Set<string>([Codes.staleToken, Codes.leaseExpired, Codes.leaseReleased, Codes.unknownLease]);

/** The error for a gateway answer: the class follows the code, then the status. */
export function errorFor(op: Op, status: number, problem: Problem | undefined, retryAfterMs: number): FencegwError {
  const code = problem?.code ?? "";
  const init: ErrorInit = { op, status, code, problem, retryAfterMs };
  const message = `fencegw: ${op}: ${status}${code ? " " + code : ""}${describe(problem)}`;
  if (staleCodes.has(code)) return new StaleLeaseError(message, init);
  if (code === Codes.leaseLost || (code === Codes.notFound && (op === "renew" || op === "release"))) {
    return new LeaseLostError(message, init);
  }
  if (code === Codes.leaseHeld) return new LeaseHeldError(message, init);
  if (code === Codes.upstreamUnreachable || code === Codes.upstreamTimeout) return new UpstreamError(message, init);
  if (code === Codes.outcomeUnknown) return new OutcomeUnknownError(message, init);
  if (status === 503) return new UnavailableError(message, init);
  // A bare 502/504 on a control call is an intermediary that could not reach the gateway.
  if (problem === undefined && op !== "write" && (status === 502 || status === 504)) {
    return new UnavailableError(message, init);
  }
  return new FencegwError(message, init);
}

/** The error for a call the gateway did not answer. */
export function unreachable(op: Op, why: string, cause: unknown): UnavailableError {
  const detail = cause instanceof Error ? `: ${cause.message}${causeText(cause)}` : "";
  return new UnavailableError(`fencegw: ${op}: gateway unreachable (${why})${detail}`, { op, cause });
}

function causeText(err: Error): string {
  const c = (err as { cause?: unknown }).cause;
  return c instanceof Error ? ` (${c.message})` : "";
}

function describe(p: Problem | undefined): string {
  if (p === undefined) return "";
  let s = p.detail ? `: ${p.detail}` : p.title ? `: ${p.title}` : "";
  if (p.resource && !s.includes(p.resource)) s += ` (resource ${JSON.stringify(p.resource)})`;
  return s;
}

/** Whether headers declare application/problem+json. */
export function isProblem(headers: Headers): boolean {
  const ct = headers.get("content-type") ?? "";
  return ct.split(";")[0]!.trim().toLowerCase() === "application/problem+json";
}

/**
 * The gateway's own problem document in text, or undefined if it is not one
 * (an upstream's problem, or not JSON). A problem without `code` takes it
 * from its `type`.
 */
export function parseProblem(text: string): Problem | undefined {
  let p: unknown;
  try {
    p = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof p !== "object" || p === null) return undefined;
  const doc = p as Problem;
  if (typeof doc.type !== "string" || !doc.type.startsWith(problemTypePrefix)) return undefined;
  if (typeof doc.code !== "string" || doc.code === "") doc.code = doc.type.slice(problemTypePrefix.length);
  return doc;
}

/** Retry-After (seconds or an HTTP date) in milliseconds; 0 if absent. */
export function retryAfterMs(headers: Headers): number {
  const v = (headers.get("retry-after") ?? "").trim();
  if (v === "") return 0;
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const t = Date.parse(v);
  return Number.isNaN(t) ? 0 : Math.max(0, t - Date.now());
}
