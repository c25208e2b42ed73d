// One bounded HTTP exchange with the gateway: the deadline, the caller's
// abort, and the translation of "no answer" and problem answers into the
// SDK's errors.
import { errorFor, isProblem, parseProblem, retryAfterMs, unreachable, type Op, type Problem, type FencegwError } from "./errors.js";

/** What a lease needs of its client: where the gateway is and how to authenticate. */
export interface Gateway {
  /** The gateway's base URL without a trailing slash. */
  readonly base: string;
  /** Headers sent with every call (Authorization). */
  readonly headers: Readonly<Record<string, string>>;
  readonly fetch: typeof fetch;
}

/** Problem bodies longer than this are not read to classify them (the gateway's are far smaller). */
export const maxProblemBody = 64 << 10;

export interface Exchange {
  op: Op;
  method: string;
  url: string;
  headers?: Headers;
  body?: RequestInit["body"];
  /** No answer (headers) within this long: UnavailableError. */
  timeoutMs: number;
  /** The caller's abort: the fetch ends with this signal's reason. */
  signal?: AbortSignal | undefined;
  /** Read the whole body before the deadline ends (control calls). */
  readBody?: boolean;
}

export interface Answer {
  response: Response;
  /** The body, if readBody. */
  text: string;
}

/**
 * send makes one exchange. It rejects with the caller signal's reason if
 * that fired, with an UnavailableError if the gateway did not answer in
 * time or at all, and otherwise resolves to the answer, whatever its status.
 */
export async function send(gw: Gateway, x: Exchange): Promise<Answer> {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(new Error(`no answer within ${x.timeoutMs} ms`)), x.timeoutMs);
  const onAbort = () => ctl.abort(x.signal!.reason);
  if (x.signal) {
    if (x.signal.aborted) onAbort();
    else x.signal.addEventListener("abort", onAbort, { once: true });
  }
  try {
    const response = await gw.fetch(x.url, {
      method: x.method,
      headers: x.headers ?? {},
      body: x.body ?? null,
      signal: ctl.signal,
      // A fenced write is never followed elsewhere with its lease.
      redirect: "manual",
    });
    const text = x.readBody ? await response.text() : "";
    return { response, text };
  } catch (err) {
    if (x.signal?.aborted) throw x.signal.reason;
    if (ctl.signal.aborted) throw unreachable(x.op, ctl.signal.reason.message, err);
    throw unreachable(x.op, "no answer", err);
  } finally {
    clearTimeout(timer);
    x.signal?.removeEventListener("abort", onAbort);
  }
}

/** The error for a control call's unexpected answer. */
export function answerError(op: Op, a: Answer): FencegwError {
  const problem: Problem | undefined = isProblem(a.response.headers) ? parseProblem(a.text) : undefined;
  return errorFor(op, a.response.status, problem, retryAfterMs(a.response.headers));
}

/** The Fencing-Client-Time header's value for a call sent now after a round trip of rttMs (0: unknown). */
export function clientTime(rttMs: number): string {
  const now = new Date().toISOString();
  return rttMs > 0 ? `${now};rtt=${rttMs.toFixed(1)}` : now;
}
